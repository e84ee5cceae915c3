//! What the author of an EtcdCluster can get past the host (review M5, M6), against the real
//! API server: the author is a user who may only `create` EtcdClusters in the namespace
//! (impersonated), and the etcd plugin is loaded from the shipped bundle's ConfigMap
//! (`policies/etcd.yaml`, with its image allow-list). A member pod with an unconfined
//! `securityContext`, an image outside the allow-list, or a Secret of the namespace not opted
//! in for the plugin is refused with an `ActionRefused` Event on the cluster, and no pod is
//! written; once the Secret's owner labels it, the same cluster gets its pod.
//!
//! Runs policy-host in-process against the shared test environment, in a namespace of its own.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use policy_host::decide::Limits;
use policy_host_e2e::etcd::{etcd_clusters, etcd_version};
use policy_host_e2e::plugins::{self, WAIT};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd, repo_root};
use policy_host_testenv::{TestEnv, shared_node, wait_for};
use serde::Deserialize;
use serde_json::{Value, json};

/// The tenant: may create EtcdClusters in the test's namespace, nothing else.
const TENANT: &str = "etcd-tenant";

/// The plugin ConfigMap of the shipped bundle, to be applied in `namespace`.
fn shipped_pack(namespace: &str) -> anyhow::Result<ConfigMap> {
    let text = std::fs::read_to_string(repo_root().join("policies/etcd.yaml"))?;
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document)?;
        if value["kind"].as_str() == Some("ConfigMap") {
            let mut cm: ConfigMap = serde_yaml::from_value(value)?;
            cm.metadata.namespace = Some(namespace.to_owned());
            return Ok(cm);
        }
    }
    anyhow::bail!("policies/etcd.yaml carries no ConfigMap")
}

/// A client acting as [`TENANT`], whom a Role lets only create EtcdClusters in `namespace`.
async fn tenant_client(env: &TestEnv, admin: &Client, namespace: &str) -> anyhow::Result<Client> {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": TENANT},
        "rules": [{"apiGroups": ["etcd.database.coreos.com"], "resources": ["etcdclusters"],
                   "verbs": ["create"]}],
    }))?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": TENANT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TENANT},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}],
    }))?;
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await?;
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await?;
    let mut config = env.kube_config().await?;
    config.auth_info.impersonate = Some(TENANT.to_owned());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".to_owned()]);
    Ok(Client::try_from(config)?)
}

/// Member pods of cluster `name`.
async fn pods_of(pods: &Api<Pod>, name: &str) -> anyhow::Result<Vec<Pod>> {
    Ok(pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
        .await?
        .items)
}

/// Creates cluster `name` with `spec` as the tenant (a POST: the tenant may not patch).
async fn create_cluster(
    tenant: &Api<DynamicObject>,
    name: &str,
    spec: Value,
) -> anyhow::Result<()> {
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
        "metadata": {"name": name}, "spec": spec,
    }))?;
    tenant.create(&PostParams::default(), &cluster).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_gets_no_pod_beyond_baseline_no_unlisted_image_and_no_secret_not_opted_in()
-> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let admin = env.client().await?;
    install_crd(&admin, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("etcd-tenant").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &namespace);
    let version = etcd_version(env, "3.6")?;

    let outcome = async {
        plugins::apply_pack(&config_maps, shipped_pack(&namespace)?, "etcd-tenant-e2e").await?;
        wait_for("the shipped etcd plugin to load", WAIT, || async {
            (!host.running.store.list().is_empty()).then_some(())
        })
        .await?;
        let tenant: Api<DynamicObject> = Api::namespaced_with(
            tenant_client(env, &admin, &namespace).await?,
            &namespace,
            &etcd_clusters(),
        );
        // The tenant may create clusters, and nothing else: not read a Secret, not make a pod.
        anyhow::ensure!(
            Api::<Secret>::namespaced(tenant.clone().into_client(), &namespace)
                .list(&ListParams::default())
                .await
                .is_err(),
            "the tenant can list Secrets; the test would prove nothing"
        );

        let rows = [
            (
                "unconfined",
                json!({"size": 1, "version": version,
                    "pod": {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}}),
                "spc_t",
            ),
            (
                "apparmor",
                json!({"size": 1, "version": version,
                    "pod": {"annotations": {"container.apparmor.security.beta.kubernetes.io/etcd": "unconfined"}}}),
                "container.apparmor.security.beta.kubernetes.io/etcd",
            ),
            (
                "foreign-image",
                json!({"size": 1, "version": version, "repository": "evil.example/etcd"}),
                "evil.example/etcd",
            ),
        ];
        for (name, spec, _) in &rows {
            create_cluster(&tenant, name, spec.clone()).await?;
        }
        for (name, _, fragment) in &rows {
            let event = plugins::event_about(&events, name, "ActionRefused", |note| {
                note.contains(fragment)
            })
            .await?;
            eprintln!("[{namespace}] {name}: {}", event.note.unwrap_or_default());
        }

        // A Secret of the namespace that its owner has not opted in for the plugin.
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "db-admin"},
            "type": "kubernetes.io/tls",
            "stringData": {"ca.crt": "x", "tls.crt": "x", "tls.key": "x"},
        }))?;
        secrets.create(&PostParams::default(), &secret).await?;
        create_cluster(
            &tenant,
            "borrower",
            json!({"size": 1, "version": version, "tls": {
                "peerSecret": "db-admin", "serverSecret": "db-admin", "operatorSecret": "db-admin"}}),
        )
        .await?;
        plugins::event_about(&events, "borrower", "ActionRefused", |note| {
            note.contains("db-admin") && note.contains("mountable-by.policy-host.io/etcd=true")
        })
        .await?;
        for name in ["unconfined", "apparmor", "foreign-image", "borrower"] {
            let written = pods_of(&pods, name).await?;
            anyhow::ensure!(
                written.is_empty(),
                "{name}: a refused decision wrote pods {:?}",
                written.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
            );
        }

        // Its owner opts it in: the same cluster now gets its member pod, with the Secret.
        let label = json!({"metadata": {"labels": {"mountable-by.policy-host.io/etcd": "true"}}});
        secrets
            .patch("db-admin", &PatchParams::default(), &Patch::Merge(&label))
            .await?;
        let pod = wait_for("the borrower's member pod, once opted in", WAIT, || async {
            pods_of(&pods, "borrower").await.ok()?.into_iter().next()
        })
        .await?;
        let mounted: BTreeMap<String, String> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| Some((v.name.clone(), v.secret.as_ref()?.secret_name.clone()?)))
            .collect();
        anyhow::ensure!(
            mounted.values().any(|s| s == "db-admin"),
            "the member pod does not mount the opted-in Secret: {mounted:?}"
        );
        Ok(())
    }
    .await;
    host.stop().await;
    outcome
}
