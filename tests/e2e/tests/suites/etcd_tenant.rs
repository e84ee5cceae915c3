//! What the author of an EtcdCluster can get past the host (review M5), against the real API
//! server: the author is a user who may only `create` EtcdClusters in the namespace
//! (impersonated), and the etcd plugin is loaded from the shipped bundle's ConfigMap
//! (`policies/etcd.yaml`). A member pod with an unconfined `securityContext` or AppArmor
//! annotation is refused with an `ActionRefused` Event on the cluster, and no pod is written.
//!
//! Runs policy-host in-process against the shared test environment, in a namespace of its own.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
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
async fn a_tenant_gets_no_pod_beyond_baseline() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let admin = env.client().await?;
    install_crd(&admin, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("etcd-tenant").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
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

        for name in ["unconfined", "apparmor"] {
            let written = pods_of(&pods, name).await?;
            anyhow::ensure!(
                written.is_empty(),
                "{name}: a refused decision wrote pods {:?}",
                written.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
            );
        }

        Ok(())
    }
    .await;
    host.stop().await;
    outcome
}
