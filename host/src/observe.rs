//! Observe: gathers a parent, the children it controls and the time into the observation a
//! plugin decides from, and the app-call scope that goes with it.
//!
//! Children come from the controller's own watch caches (one reflector per declared child
//! kind, filtered by the label the host puts on everything it applies), so an observation costs
//! no API call.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::Store;

use crate::app_call::PodEndpoint;
use crate::decide::contract::{Child, KindRef, Observation, Timestamp};

/// The watch cache of one declared child kind.
#[derive(Clone)]
pub struct ChildCache {
    /// The kind as the plugin declared it.
    pub kind: KindRef,
    /// The kind as kube-rs addresses it.
    pub resource: ApiResource,
    /// Objects of that kind carrying the host's policy label.
    pub store: Store<DynamicObject>,
}

/// An observation plus what the host needs to carry out the decision made from it.
pub struct Observed {
    /// What the plugin sees.
    pub observation: Observation,
    /// Pods the parent controls, by name, for app-calls.
    pub pods: HashMap<String, PodEndpoint>,
    /// Names of the children the parent controls, per kind (`plural.apiVersion`).
    pub owned: HashMap<String, Vec<String>>,
}

/// Builds the observation of `parent` from the child caches.
pub fn observe(
    parent: &DynamicObject,
    caches: &[ChildCache],
) -> Result<Observed, serde_json::Error> {
    let parent_uid = parent.uid().unwrap_or_default();
    let mut children = Vec::new();
    let mut pods = HashMap::new();
    let mut owned: HashMap<String, Vec<String>> = HashMap::new();
    for cache in caches {
        let mut objects: Vec<_> = cache
            .store
            .state()
            .into_iter()
            .filter(|child| is_controlled_by(child, &parent_uid))
            .collect();
        // A stable order, so the same world gives the plugin the same observation.
        objects.sort_by_key(|o| o.name_any());
        for object in objects {
            let json = serde_json::to_string(object.as_ref())?;
            if cache.kind.group.is_empty()
                && cache.kind.kind == "Pod"
                && let Ok(pod) = serde_json::from_str::<Pod>(&json)
            {
                pods.insert(object.name_any(), PodEndpoint::from_pod(&pod));
            }
            owned
                .entry(cache.kind.to_string())
                .or_default()
                .push(object.name_any());
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
