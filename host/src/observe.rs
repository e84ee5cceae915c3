//! Observe: gathers a parent, the children it controls and the time into the observation a
//! plugin decides from, and the app-call scope that goes with it.
//!
//! Children come from the controller's own watch caches (one per declared child kind,
//! filtered by the label the host puts on everything it applies, see [`cache`]), so an
//! observation costs no API call, and each cache's [`owner_index`] hands over the parent's
//! children without a scan of the cache. Each child is cached as the JSON text the plugin is
//! shown ([`child`]), so observing one copies its text instead of writing out a tree. A child is the parent's when it lives in the
//! parent's namespace and its controller reference carries the parent's uid: the caches are
//! cluster-wide, and anyone who may create objects in another namespace can write any uid into
//! an owner reference.

pub mod admission;
pub mod cache;
pub mod child;
pub mod owner_index;

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};
use serde::Deserialize;

use crate::capability::scope::{PodEndpoint, unreachable_why};
use crate::contract::{Child, Observation, Timestamp};

pub use cache::ChildCache;
pub use child::CachedChild;

/// An observation plus what the host needs to carry out the decision made from it.
pub struct Observed {
    /// What the plugin sees.
    pub observation: Observation,
    /// Pods the parent controls, by name, for app-calls.
    pub pods: HashMap<String, PodEndpoint>,
    /// The children the parent controls, per kind (`plural.apiVersion`), by name. Deletes
    /// and applies carry the uid, so they act on the object observed and no other.
    pub owned: HashMap<String, HashMap<String, OwnedChild>>,
}

/// A child the parent controls, as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedChild {
    /// Its uid: the precondition of every write to it.
    pub uid: String,
    /// Its resourceVersion: an apply is skipped only while this is what the host's own last
    /// apply left (see `act::applied`).
    pub resource_version: String,
}

/// Builds the observation of `parent` from the child caches.
pub fn observe(
    parent: &DynamicObject,
    caches: &[ChildCache],
) -> Result<Observed, serde_json::Error> {
    let mut children = Vec::new();
    let mut pods = HashMap::new();
    let mut owned: HashMap<String, HashMap<String, OwnedChild>> = HashMap::new();
    for cache in caches {
        // Ordered by name: the same world gives the plugin the same observation.
        for object in cache.controlled_by(parent) {
            let json = object.to_json()?;
            if cache.kind.group.is_empty() && cache.kind.kind == "Pod" {
                pods.insert(object.name_any(), pod_endpoint(&object));
            }
            owned.entry(cache.kind.to_string()).or_default().insert(
                object.name_any(),
                OwnedChild {
                    uid: object.uid().unwrap_or_default(),
                    resource_version: object.resource_version().unwrap_or_default(),
                },
            );
            children.push(Child {
                kind: cache.kind.clone(),
                object: json,
            });
        }
    }
    Ok(Observed {
        observation: Observation {
            parent: serde_json::to_string(parent)?,
            children,
            now: now(),
        },
        pods,
        owned,
    })
}

/// Where a cached Pod can be reached, read from its cached text: the same fields as
/// [`PodEndpoint::from_pod`] without parsing a whole typed `Pod`, which would run for every pod
/// of every observation. serde skips every other field of the text without keeping it.
fn pod_endpoint(pod: &CachedChild) -> PodEndpoint {
    let fields: PodFields = match serde_json::from_str(pod.body()) {
        Ok(fields) => fields,
        // The API server checks a Pod against its schema, so this takes a pod no API server
        // sent; the plugin still sees it, but the host will not call a pod it cannot read.
        Err(error) => {
            return PodEndpoint {
                ip: None,
                named_ports: HashMap::new(),
                declared_ports: Vec::new(),
                unreachable: Some(format!("its spec or status could not be read: {error}")),
            };
        }
    };
    let ports = || {
        fields
            .spec
            .containers
            .iter()
            .flatten()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| Some((p.name.as_deref(), u16::try_from(p.container_port?).ok()?)))
    };
    PodEndpoint {
        ip: fields.status.pod_ip.clone().filter(|ip| !ip.is_empty()),
        named_ports: ports()
            .filter_map(|(name, number)| Some((name?.to_owned(), number)))
            .collect(),
        declared_ports: ports().map(|(_, number)| number).collect(),
        unreachable: unreachable_why(
            fields.spec.host_network.unwrap_or(false),
            fields.status.phase.as_deref().unwrap_or_default(),
        ),
    }
}

/// The fields of a Pod that [`pod_endpoint`] reads. Each is optional, as in the API: a pod
/// without a status (not scheduled yet) or without ports is read, not refused.
#[derive(Deserialize, Default)]
#[serde(default)]
struct PodFields {
    spec: PodSpecFields,
    status: PodStatusFields,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodSpecFields {
    containers: Option<Vec<ContainerFields>>,
    host_network: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ContainerFields {
    ports: Option<Vec<PortFields>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PortFields {
    name: Option<String>,
    container_port: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodStatusFields {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    phase: Option<String>,
}

/// True when `child` has a controller owner reference to the object with `uid`.
pub fn is_controlled_by(child: &impl Resource, uid: &str) -> bool {
    child
        .owner_references()
        .iter()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

/// The current time as the contract carries it.
pub fn now() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanoseconds: since.subsec_nanos(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::KindRef;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ApiResource;

    /// Pure logic on in-memory objects: the direct read agrees with the typed one.
    #[test]
    fn pod_endpoint_reads_what_the_typed_pod_gives() {
        let rows = [
            (
                "a running pod with named and unnamed ports",
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-0"},
                    "spec": {"containers": [
                        {"name": "etcd", "ports": [{"name": "client", "containerPort": 2379},
                            {"name": "peer", "containerPort": 2380}, {"containerPort": 9090}]},
                        {"name": "side", "ports": [{"name": "metrics", "containerPort": 8080}]}]},
                    "status": {"podIP": "10.0.0.7"}}),
            ),
            (
                "a pending pod with an empty IP and no ports",
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-1"},
                    "spec": {"containers": [{"name": "etcd"}]}, "status": {"podIP": ""}}),
            ),
            (
                "a failed pod on the node's network",
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-3"},
                    "spec": {"hostNetwork": true, "containers": [{"name": "etcd", "ports": [{"containerPort": 2379}]}]},
                    "status": {"podIP": "10.0.0.9", "phase": "Failed"}}),
            ),
            (
                "a pod with no status",
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-2"},
                    "spec": {"containers": [{"name": "etcd", "ports": [{"name": "big", "containerPort": 70000}]}]}}),
            ),
            (
                "a pod with no spec",
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-4"},
                    "status": {"podIP": "10.0.0.4", "phase": "Running"}}),
            ),
            (
                "a succeeded pod whose container lists null ports",
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-5"},
                    "spec": {"containers": [{"name": "etcd", "ports": null}]},
                    "status": {"podIP": "10.0.0.5", "phase": "Succeeded"}}),
            ),
        ];
        for (situation, json) in rows {
            let typed: Pod = serde_json::from_value(json.clone()).expect(situation);
            let cached: CachedChild = serde_json::from_value(json).expect(situation);
            let (want, got) = (PodEndpoint::from_pod(&typed), pod_endpoint(&cached));
            assert_eq!(got.ip, want.ip, "{situation}");
            assert_eq!(got.named_ports, want.named_ports, "{situation}");
            assert_eq!(got.declared_ports, want.declared_ports, "{situation}");
            assert_eq!(got.unreachable, want.unreachable, "{situation}");
        }
    }

    fn object(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).expect("a valid object")
    }

    fn pod(namespace: &str, name: &str, controller_uid: &str) -> DynamicObject {
        object(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}"),
                "ownerReferences": [{"apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                    "name": "parent", "uid": controller_uid, "controller": true}],
            },
            "spec": {"containers": [{"name": "app"}]},
        }))
    }

    /// An empty Pod cache and its writer.
    fn empty_pod_cache() -> (ChildCache, cache::ChildCacheWriter) {
        let kind = KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
            namespaced: true,
        };
        ChildCache::new(kind, ApiResource::erase::<Pod>(&()))
    }

    fn pod_cache(pods: Vec<DynamicObject>) -> ChildCache {
        let (cache, mut writer) = empty_pod_cache();
        for pod in pods {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod.into()));
        }
        cache
    }

    /// A pod whose text the API server would not have sent is observed (the plugin sees it),
    /// but the host refuses to call it instead of guessing its address.
    #[test]
    fn a_pod_that_cannot_be_read_is_observed_but_not_called() {
        let mut odd = pod("ns", "odd", "parent-uid");
        odd.data["status"] = serde_json::json!({"podIP": 7});
        let parent = object(serde_json::json!({
            "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
            "metadata": {"name": "parent", "namespace": "ns", "uid": "parent-uid"},
        }));
        let observed = observe(&parent, &[pod_cache(vec![odd])]).expect("observation encodes");
        assert_eq!(observed.observation.children.len(), 1);
        let endpoint = &observed.pods["odd"];
        assert_eq!(endpoint.ip, None);
        assert!(
            endpoint
                .unreachable
                .as_deref()
                .is_some_and(|why| why.contains("could not be read")),
            "{:?}",
            endpoint.unreachable
        );
    }

    /// The plugin is shown each child exactly as the host showed it when children were cached
    /// as `DynamicObject`s: the text `serde_json` wrote from the object, byte for byte.
    #[test]
    fn the_plugin_sees_each_child_as_a_dynamic_object_wrote_it() {
        let parent = object(serde_json::json!({
            "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
            "metadata": {"name": "parent", "namespace": "ns", "uid": "parent-uid"},
        }));
        let pods: Vec<DynamicObject> = (0..3)
            .map(|i| {
                let mut pod = pod("ns", &format!("db-{i}"), "parent-uid");
                pod.labels_mut().insert("member".into(), format!("db-{i}"));
                pod.data["status"] = serde_json::json!({"phase": "Running", "podIP": format!("10.0.0.{i}"),
                    "conditions": [{"type": "Ready", "status": "True"}]});
                pod
            })
            .collect();
        let want: Vec<String> = pods
            .iter()
            .map(|p| serde_json::to_string(p).expect("json"))
            .collect();
        let observed = observe(&parent, &[pod_cache(pods)]).expect("observation encodes");
        let got: Vec<String> = observed
            .observation
            .children
            .into_iter()
            .map(|c| c.object)
            .collect();
        assert_eq!(got, want);
    }

    /// A labelled Pod in another namespace whose controller reference carries the parent's uid
    /// (anyone who may create Pods there can write one) is not the parent's child: it must not
    /// reach the plugin, the app-call scope, or the names deletes are allowed for.
    #[test]
    fn children_in_another_namespace_are_not_observed_even_with_the_parents_uid() {
        let parent = object(serde_json::json!({
            "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
            "metadata": {"name": "parent", "namespace": "team-a", "uid": "parent-uid"},
        }));
        let cache = pod_cache(vec![
            pod("team-a", "db-0", "parent-uid"),
            pod("team-b", "db-0", "parent-uid"),
            pod("team-b", "intruder", "parent-uid"),
            pod("team-a", "other", "someone-elses-uid"),
        ]);
        let observed = observe(&parent, &[cache]).expect("observation encodes");
        let namespaces: Vec<String> = observed
            .observation
            .children
            .iter()
            .map(|c| {
                let child: serde_json::Value = serde_json::from_str(&c.object).expect("json");
                format!(
                    "{}/{}",
                    child["metadata"]["namespace"].as_str().unwrap_or_default(),
                    child["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(namespaces, ["team-a/db-0"]);
        assert_eq!(observed.pods.keys().collect::<Vec<_>>(), ["db-0"]);
        let owned_pods = &observed.owned["pods.v1"];
        assert_eq!(owned_pods.len(), 1, "{owned_pods:?}");
        assert_eq!(
            owned_pods.get("db-0").map(|child| child.uid.as_str()),
            Some("uid-team-a-db-0"),
            "the observed uid goes with the name"
        );
    }

    /// What observe gave before the owner index, a scan of the whole cache, is what it gives
    /// now, byte for byte, after children were added, moved to another parent, deleted and
    /// re-listed. In-memory: the watch events are built by hand.
    #[test]
    fn the_index_observes_what_a_scan_of_the_cache_finds() {
        use kube::runtime::watcher::Event;
        let parents: Vec<DynamicObject> = ["team-a", "team-b"]
            .iter()
            .flat_map(|namespace| {
                (0..3).map(move |p| {
                    object(serde_json::json!({
                        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                        "metadata": {"name": format!("p{p}"), "namespace": namespace,
                            "uid": format!("{namespace}-p{p}")},
                    }))
                })
            })
            .collect();
        let (cache, mut writer) = empty_pod_cache();
        let mut events = vec![Event::Init];
        for namespace in ["team-a", "team-b"] {
            for i in 0..12 {
                // Children of every parent, some claiming a parent of the other namespace.
                let owner = format!("{}-p{}", ["team-a", "team-b"][i % 5 % 2], i % 3);
                events.push(Event::InitApply(
                    pod(namespace, &format!("m{i:02}"), &owner).into(),
                ));
            }
        }
        events.push(Event::InitDone);
        events.push(Event::Apply(pod("team-a", "m00", "team-a-p2").into()));
        events.push(Event::Delete(pod("team-a", "m03", "team-a-p0").into()));
        events.push(Event::Apply(pod("team-b", "late", "team-b-p1").into()));
        for event in &events {
            writer.apply_watcher_event(event);
        }
        // A re-list that lost one child and kept the rest.
        writer.apply_watcher_event(&Event::Init);
        for child in cache.store.state() {
            if child.name_any() != "m04" {
                writer.apply_watcher_event(&Event::InitApply(child.as_ref().clone()));
            }
        }
        writer.apply_watcher_event(&Event::InitDone);

        for parent in &parents {
            let uid = parent.uid().unwrap_or_default();
            let mut scanned = cache.store.state_filter(|child| {
                child.namespace() == parent.namespace() && is_controlled_by(child, &uid)
            });
            scanned.sort_by_key(|o| o.name_any());
            let scanned: Vec<String> = scanned.iter().map(|o| o.to_json().expect("json")).collect();
            let observed = observe(parent, std::slice::from_ref(&cache)).expect("observation");
            let indexed: Vec<String> = observed
                .observation
                .children
                .into_iter()
                .map(|c| c.object)
                .collect();
            assert!(!scanned.is_empty(), "{uid} has children to find");
            assert_eq!(indexed, scanned, "{uid}");
        }
    }
}
