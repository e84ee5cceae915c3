//! Ownership against the real API server: the host never takes over an object its parent does
//! not control, never writes to or deletes an object that replaced the one a decision was made
//! about, never overwrites a status newer than the one the plugin saw, and never writes a
//! plugin ConfigMap for a plugin.
//!
//! The first test runs the host with the etcd plugin; the others drive the act stage
//! (`Executor::apply_decision`) directly with a hand-built stale observation, the only way to
//! make "the world changed between observe and act" happen on purpose rather than by luck.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use policy_host::act::{ActError, Carried, Executor};
use policy_host::contract::{Action, KindRef, ObjectRef, PolicyInfo};
use policy_host::decide::Limits;
use policy_host::observe::{CachedChild, ChildCache, Observed, observe};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd, install_crd_object, probe_crd};
use policy_host_testenv::{TestNamespace, shared_node, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

fn etcd_clusters() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", "EtcdCluster"),
        "etcdclusters",
    )
}

async fn events_about(client: &Client, namespace: &str, name: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// Another team's objects whose names happen to be the ones EtcdCluster `x` (Service
/// `x-client`, claim `data-x-0`) and `y` (claim `data-y-0`) would use. The host refuses each
/// decision that applies one of them, whole (nothing of it written, not even the objects whose
/// names were free); the other team's objects keep their spec and gain no owner, and deleting
/// the clusters leaves them alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_cluster_never_takes_over_a_service_or_claim_it_does_not_own() -> anyhow::Result<()>
{
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("ownership-etcd").await?;

    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "x-client", "labels": { "team": "other" } },
                "spec": { "selector": { "app": "other-team" },
                          "ports": [{ "name": "http", "port": 8080 }] }
            }))?,
        )
        .await?;
    for claim in ["data-x-0", "data-y-0"] {
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": claim, "labels": { "team": "other" } },
                    "spec": { "accessModes": ["ReadWriteOnce"],
                              "resources": { "requests": { "storage": "1Gi" } } }
                }))?,
            )
            .await?;
    }

    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let host = HostUnderTest::start(env, &[plugin], &namespace, Limits::default()).await?;
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &etcd_clusters());
    let mut created = Vec::new();
    for name in ["x", "y"] {
        let cluster = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "metadata": { "name": name },
            "spec": { "size": 1, "storage": { "size": "1Gi" } }
        });
        created.push(
            clusters
                .patch(
                    name,
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(&cluster),
                )
                .await?,
        );
    }

    // Whatever the host does with a cluster's decisions shows up as one of these: a refusal
    // naming the object, or the object taken over.
    let refused_over = |cluster: &'static str, object: &'static str| {
        let (client, namespace) = (client.clone(), namespace.to_string());
        let (services, claims) = (services.clone(), claims.clone());
        async move {
            wait_for(&format!("the host acting on {object}"), WAIT, || async {
                let refusal = events_about(&client, &namespace, cluster)
                    .await
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("ActionRefused")
                            && e.note.as_deref().is_some_and(|n| n.contains(object))
                    });
                let owners = match object.starts_with("data-") {
                    true => claims
                        .get_opt(object)
                        .await
                        .ok()
                        .flatten()
                        .map(|c| c.metadata),
                    false => services
                        .get_opt(object)
                        .await
                        .ok()
                        .flatten()
                        .map(|s| s.metadata),
                };
                let taken =
                    owners.is_some_and(|m| m.owner_references.is_some_and(|r| !r.is_empty()));
                match (refusal, taken) {
                    (Some(event), _) => Some(Ok(event)),
                    (None, true) => Some(Err(anyhow::anyhow!(
                        "the host took over another team's {object} for EtcdCluster {cluster}"
                    ))),
                    (None, false) => None,
                }
            })
            .await?
        }
    };
    let refusal = refused_over("x", "x-client").await?;
    assert_eq!(refusal.type_.as_deref(), Some("Warning"));
    // y's first decisions (Services, PDB) are its own; the one that adds the member's claim is
    // refused.
    refused_over("y", "data-y-0").await?;

    let untouched = |what: &str, meta: &kube::api::ObjectMeta| {
        assert!(
            meta.owner_references
                .as_deref()
                .unwrap_or_default()
                .is_empty(),
            "{what} gained an owner: {:?}",
            meta.owner_references
        );
        let labels = meta.labels.clone().unwrap_or_default();
        assert!(
            !labels.contains_key("policy-host.io/policy"),
            "{what}: {labels:?}"
        );
        assert_eq!(labels.get("team").map(String::as_str), Some("other"));
    };
    let service = services.get("x-client").await?;
    untouched("Service x-client", &service.metadata);
    let selector = service.spec.and_then(|s| s.selector).unwrap_or_default();
    assert_eq!(
        selector.get("app").map(String::as_str),
        Some("other-team"),
        "the Service's spec is the other team's: {selector:?}"
    );
    for claim in ["data-x-0", "data-y-0"] {
        untouched(claim, &claims.get(claim).await?.metadata);
    }
    assert!(
        services.get_opt("x").await?.is_none(),
        "nothing of x's refused decision is written, not even the free headless Service"
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
    assert!(
        pods.get_opt("y-0").await?.is_none(),
        "nothing of y's refused decision is written, not even the member pod"
    );

    // Delete both and wait until the garbage collector has handled their dependents (a probe
    // each owns is gone): the other team's objects are still there.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    for cluster in &created {
        let owner = cluster
            .controller_owner_ref(&etcd_clusters())
            .ok_or_else(|| anyhow::anyhow!("{} has no uid", cluster.name_any()))?;
        let probe = format!("{}-gc-probe", cluster.name_any());
        config_maps
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": probe, "ownerReferences": [owner] }
                }))?,
            )
            .await?;
        clusters
            .delete(&cluster.name_any(), &DeleteParams::background())
            .await?;
        wait_for(
            &format!("the garbage collector deleting {probe}"),
            WAIT,
            || async {
                config_maps
                    .get_opt(&probe)
                    .await
                    .ok()
                    .and_then(|c| c.is_none().then_some(()))
            },
        )
        .await?;
    }
    untouched(
        "Service x-client",
        &services.get("x-client").await?.metadata,
    );
    for claim in ["data-x-0", "data-y-0"] {
        untouched(claim, &claims.get(claim).await?.metadata);
    }
    host.stop().await;
    Ok(())
}

fn config_map_kind() -> KindRef {
    KindRef {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
    }
}

/// The act stage of a policy whose `Probe` parents have ConfigMap children, and a fresh
/// `Probe` parent in a fresh namespace.
struct Stage {
    executor: Executor,
    parent: DynamicObject,
    parents: Api<DynamicObject>,
    config_maps: Api<ConfigMap>,
    /// Deleted when the stage drops, at the end of its test.
    _namespace: TestNamespace,
}

impl Stage {
    async fn new(prefix: &str) -> anyhow::Result<Self> {
        init_logging();
        let env = shared_node().await?;
        let client = env.client().await?;
        install_crd_object(&client, probe_crd()?).await?;
        let namespace = env.create_namespace(prefix).await?;
        let info = PolicyInfo {
            name: "ownership".into(),
            version: "0.0.0".into(),
            target: KindRef {
                group: "test.policy-host.io".into(),
                version: "v1".into(),
                kind: "Probe".into(),
                plural: "probes".into(),
                namespaced: true,
            },
            children: vec![config_map_kind()],
            capabilities: Vec::new(),
            wants_finalizer: false,
        };
        let executor = Executor::new(client.clone(), "ownership@0.0.0", &info);
        let parents: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &policy_host_e2e::probes());
        let parent = parents
            .patch(
                "p",
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&json!({
                    "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                    "metadata": { "name": "p" }, "spec": { "behaviour": "ok" }
                })),
            )
            .await?;
        Ok(Self {
            config_maps: Api::namespaced(client, &namespace),
            executor,
            parent,
            parents,
            _namespace: namespace,
        })
    }

    /// Creates ConfigMap `name` as a child of the parent (owner reference and policy label, as
    /// the host would have applied it).
    async fn create_child(&self, name: &str) -> anyhow::Result<ConfigMap> {
        let owner = self
            .parent
            .controller_owner_ref(&policy_host_e2e::probes())
            .ok_or_else(|| anyhow::anyhow!("the parent has no uid"))?;
        Ok(self
            .config_maps
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": name, "ownerReferences": [owner],
                                  "labels": { "policy-host.io/policy": "ownership" } },
                    "data": { "who": "child" }
                }))?,
            )
            .await?)
    }

    /// Replaces ConfigMap `name` with another team's object of the same name.
    async fn replace_with_strangers(&self, name: &str) -> anyhow::Result<ConfigMap> {
        self.config_maps
            .delete(name, &DeleteParams::default())
            .await?;
        wait_for(&format!("ConfigMap {name} gone"), WAIT, || async {
            self.config_maps
                .get_opt(name)
                .await
                .ok()
                .and_then(|c| c.is_none().then_some(()))
        })
        .await?;
        Ok(self
            .config_maps
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": name, "labels": { "team": "other" } },
                    "data": { "who": "stranger" }
                }))?,
            )
            .await?)
    }

    /// What observe would have given when the watch cache still held `children`.
    fn observed_with(&self, children: Vec<ConfigMap>) -> anyhow::Result<Observed> {
        let (cache, mut writer) =
            ChildCache::new(config_map_kind(), ApiResource::erase::<ConfigMap>(&()));
        for child in children {
            let object: CachedChild = serde_json::from_value(serde_json::to_value(child)?)?;
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        Ok(observe(&self.parent, &[cache])?)
    }

    async fn act(&self, observed: &Observed, actions: Vec<Action>) -> Result<(), ActError> {
        self.executor
            .apply_decision(&self.parent, observed, actions, &mut Carried::default())
            .await
    }
}

fn apply(object: Value) -> Action {
    Action::Apply(object.to_string())
}

fn who(config_map: &ConfigMap) -> Option<&str> {
    config_map.data.as_ref()?.get("who").map(String::as_str)
}

/// The parent controlled `p-out` when the plugin decided; by the time the host writes, another
/// team's `p-out` stands in its place. The apply must not write to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_decided_on_a_stale_view_never_writes_to_a_replaced_object() -> anyhow::Result<()>
{
    let stage = Stage::new("ownership-apply").await?;
    let seen = stage.create_child("p-out").await?;
    let observed = stage.observed_with(vec![seen])?;
    stage.replace_with_strangers("p-out").await?;

    let outcome = stage
        .act(
            &observed,
            vec![apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "p-out" }, "data": { "who": "plugin" }
            }))],
        )
        .await;
    let error = outcome.err().map(|e| (e.reason(), e.to_string()));
    assert!(
        matches!(&error, Some(("StaleView", message)) if message.contains("p-out")),
        "the apply went through, or failed for another reason: {error:?}"
    );
    let live = stage.config_maps.get("p-out").await?;
    assert_eq!(who(&live), Some("stranger"));
    assert!(
        live.owner_references().is_empty(),
        "the replacement was adopted: {:?}",
        live.owner_references()
    );
    Ok(())
}

/// The same race for a delete: the plugin deletes the `p-out` it saw; the one standing there now
/// is another object and survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_decided_on_a_stale_view_never_deletes_a_replaced_object() -> anyhow::Result<()> {
    let stage = Stage::new("ownership-delete").await?;
    let seen = stage.create_child("p-out").await?;
    let observed = stage.observed_with(vec![seen])?;
    let stranger = stage.replace_with_strangers("p-out").await?;

    let outcome = stage
        .act(
            &observed,
            vec![Action::Delete(ObjectRef {
                kind: config_map_kind(),
                name: "p-out".into(),
            })],
        )
        .await;
    let live = stage.config_maps.get_opt("p-out").await?;
    assert_eq!(
        live.as_ref().and_then(|c| c.uid()),
        stranger.uid(),
        "the replacement was deleted (outcome {outcome:?})"
    );
    let reason = outcome.err().map(|e| e.reason());
    assert_eq!(
        reason,
        Some("StaleView"),
        "a delete that did not happen is reported"
    );
    Ok(())
}

/// An object the parent does not control, labelled as a plugin ConfigMap, would be loaded as
/// code by a host watching that namespace: a plugin may neither create nor label one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_carrying_the_plugin_label_is_refused() -> anyhow::Result<()> {
    let stage = Stage::new("ownership-plugin-label").await?;
    let observed = stage.observed_with(Vec::new())?;
    let outcome = stage
        .act(
            &observed,
            vec![apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "p-plugin", "labels": { "policy-host.io/plugin": "true" } },
                "data": { "who": "plugin" }
            }))],
        )
        .await;
    assert!(
        stage.config_maps.get_opt("p-plugin").await?.is_none(),
        "a plugin wrote a plugin ConfigMap (outcome {outcome:?})"
    );
    let error = outcome.err().map(|e| (e.reason(), e.to_string()));
    assert!(
        matches!(&error, Some(("ActionRefused", message)) if message.contains("policy-host.io/plugin")),
        "{error:?}"
    );
    Ok(())
}

/// The plugin decided from status `{who: old}`; meanwhile someone (a newer decision, another
/// writer) set `{who: newer}`. The stale decision's status is not written, and the error says
/// the view was stale, so the parent is decided again from what is there now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_decided_on_a_stale_parent_does_not_overwrite_the_newer_status()
-> anyhow::Result<()> {
    let stage = Stage::new("ownership-status").await?;
    let status = |who: &str| {
        json!({
            "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
            "status": { "who": who }
        })
    };
    let params = PatchParams::apply("another-writer").force();
    let seen = stage
        .parents
        .patch_status("p", &params, &Patch::Apply(&status("old")))
        .await?;
    stage
        .parents
        .patch_status("p", &params, &Patch::Apply(&status("newer")))
        .await?;

    let stale = Stage {
        parent: seen,
        ..stage
    };
    let observed = stale.observed_with(Vec::new())?;
    let outcome = stale
        .act(
            &observed,
            vec![Action::SetStatus(json!({ "who": "stale" }).to_string())],
        )
        .await;
    let live = stale.parents.get("p").await?;
    assert_eq!(
        live.data["status"]["who"], "newer",
        "a stale decision overwrote the status (outcome {outcome:?})"
    );
    let reason = outcome.err().map(|e| e.reason());
    assert_eq!(reason, Some("StaleView"));

    // Decided again from the live parent, the write goes through.
    let fresh = Stage {
        parent: live,
        ..stale
    };
    let observed = fresh.observed_with(Vec::new())?;
    fresh
        .act(
            &observed,
            vec![Action::SetStatus(json!({ "who": "fresh" }).to_string())],
        )
        .await?;
    assert_eq!(fresh.parents.get("p").await?.data["status"]["who"], "fresh");
    Ok(())
}
