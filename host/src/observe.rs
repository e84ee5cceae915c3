//! Observe: gathers a parent, the children it controls and the time into the observation a
//! plugin decides from, and the app-call scope that goes with it.
//!
//! Children come from the controller's own watch caches (one per declared child kind,
//! filtered by the label the host puts on everything it applies, see [`cache`]), so an
//! observation costs no API call, and each cache's [`owner_index`] hands over the parent's
//! children without a scan of the cache. A child is the parent's when it lives in the
//! parent's namespace and its controller reference carries the parent's uid: the caches are
//! cluster-wide, and anyone who may create objects in another namespace can write any uid into
//! an owner reference.

pub mod cache;
pub mod owner_index;

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use kube::ResourceExt;
use kube::api::DynamicObject;

use crate::capability::scope::{PodEndpoint, unreachable_why};
use crate::contract::{Child, Observation, Timestamp};

pub use cache::ChildCache;

/// An observation plus what the host needs to carry out the decision made from it.
pub struct Observed {
    /// What the plugin sees.
    pub observation: Observation,
    /// Pods the parent controls, by name, for app-calls.
    pub pods: HashMap<String, PodEndpoint>,
    /// The children the parent controls, per kind (`plural.apiVersion`): uid by name. Deletes
    /// and applies carry the uid, so they act on the object observed and no other.
    pub owned: HashMap<String, HashMap<String, String>>,
}

/// Builds the observation of `parent` from the child caches.
pub fn observe(
    parent: &DynamicObject,
    caches: &[ChildCache],
) -> Result<Observed, serde_json::Error> {
    let mut children = Vec::new();
    let mut pods = HashMap::new();
    let mut owned: HashMap<String, HashMap<String, String>> = HashMap::new();
    for cache in caches {
        // Ordered by name: the same world gives the plugin the same observation.
        for object in cache.controlled_by(parent) {
            let json = serde_json::to_string(object.as_ref())?;
            if cache.kind.group.is_empty() && cache.kind.kind == "Pod" {
                pods.insert(object.name_any(), pod_endpoint(&object));
            }
            owned
                .entry(cache.kind.to_string())
                .or_default()
                .insert(object.name_any(), object.uid().unwrap_or_default());
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

/// Where a cached Pod can be reached, read straight from its JSON: the same fields as
/// [`PodEndpoint::from_pod`] without parsing the whole typed `Pod` again, which runs for
/// every pod of every observation.
fn pod_endpoint(pod: &DynamicObject) -> PodEndpoint {
    let ip = pod.data["status"]["podIP"]
        .as_str()
        .filter(|ip| !ip.is_empty())
        .map(str::to_owned);
    let ports = || {
        pod.data["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
    };
    let named_ports = ports()
        .filter_map(|p| {
            let name = p["name"].as_str()?.to_owned();
            let number = u16::try_from(p["containerPort"].as_i64()?).ok()?;
            Some((name, number))
        })
        .collect();
    let declared_ports = ports()
        .filter_map(|p| u16::try_from(p["containerPort"].as_i64()?).ok())
        .collect();
    let host_network = pod.data["spec"]["hostNetwork"].as_bool().unwrap_or(false);
    let phase = pod.data["status"]["phase"].as_str().unwrap_or_default();
    PodEndpoint {
        ip,
        named_ports,
        declared_ports,
        unreachable: unreachable_why(host_network, phase),
    }
}

/// True when `child` has a controller owner reference to the object with `uid`.
pub fn is_controlled_by(child: &DynamicObject, uid: &str) -> bool {
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
        ];
        for (situation, json) in rows {
            let typed: Pod = serde_json::from_value(json.clone()).expect(situation);
            let dynamic: DynamicObject = serde_json::from_value(json).expect(situation);
            let (want, got) = (PodEndpoint::from_pod(&typed), pod_endpoint(&dynamic));
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
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod));
        }
        cache
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
            owned_pods.get("db-0").map(String::as_str),
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
                events.push(Event::InitApply(pod(
                    namespace,
                    &format!("m{i:02}"),
                    &owner,
                )));
            }
        }
        events.push(Event::InitDone);
        events.push(Event::Apply(pod("team-a", "m00", "team-a-p2")));
        events.push(Event::Delete(pod("team-a", "m03", "team-a-p0")));
        events.push(Event::Apply(pod("team-b", "late", "team-b-p1")));
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
            let scanned: Vec<String> = scanned
                .iter()
                .map(|o| serde_json::to_string(o.as_ref()).expect("json"))
                .collect();
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
