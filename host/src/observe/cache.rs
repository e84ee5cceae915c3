//! The watch caches observations are built from: how the API server's watch streams fill them
//! (one for the parents, one per declared child kind), what is dropped on the way in, and the
//! owner index kept beside each child cache. Children are cached in their compact form
//! ([`CachedChild`]), parents as `DynamicObject`s. Of the parents, only this host's shard's are
//! kept ([`crate::shard`]).
//!
//! Both kinds of cache admit only what their bounds allow ([`super::admission`]): a child only
//! when a parent of the policy's kind controls it, and neither past its objects and bytes.
//!
//! The controller and the scale bench both build their caches here, so the bench measures the
//! caches the host runs with.

use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::admission::{Admission, AdmissionView, CacheLimits, LIST_PAGE_SIZE, Refusal};
use super::child::CachedChild;
use super::is_controlled_by;
use super::owner_index::{OwnerIndex, OwnerIndexWriter};
use crate::contract::KindRef;
use crate::metrics::Metrics;
use crate::shard::{AssignedBy, SHARD_LABEL, Shard};

/// What bounds a policy's caches, and where they report.
#[derive(Clone)]
pub struct CacheBounds {
    /// The policy, for the metrics and warnings.
    pub policy: String,
    /// Where the caches' sizes and refusals are counted.
    pub metrics: Metrics,
    /// The bounds of each child cache.
    pub children: CacheLimits,
    /// The bounds of the parent cache.
    pub parents: CacheLimits,
}

/// The watch cache of one declared child kind.
#[derive(Clone)]
pub struct ChildCache {
    /// The kind as the plugin declared it.
    pub kind: KindRef,
    /// The kind as kube-rs addresses it.
    pub resource: ApiResource,
    /// Objects of that kind carrying the host's policy label.
    pub store: Store<CachedChild>,
    /// Which of them each controller owns, by the controller's uid.
    pub owners: OwnerIndex,
    /// What the cache holds against its bounds, and where it refused a child.
    pub admission: AdmissionView,
}

/// Fills a [`ChildCache`] from watch events: its store and its owner index, in that order, for
/// each event.
pub struct ChildCacheWriter {
    store: reflector::store::Writer<CachedChild>,
    owners: OwnerIndexWriter,
}

impl ChildCacheWriter {
    /// Applies one watch event to the store, then to the owner index: the index never names a
    /// child the store has not received yet.
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<CachedChild>) {
        self.store.apply_watcher_event(event);
        self.owners.apply_watcher_event(event);
    }
}

impl ChildCache {
    /// An empty cache of `kind` and the writer that fills it.
    pub fn new(kind: KindRef, resource: ApiResource) -> (Self, ChildCacheWriter) {
        let store = reflector::store::Writer::new(resource.clone());
        let owners = OwnerIndexWriter::new();
        let cache = Self {
            kind,
            resource,
            store: store.as_reader(),
            owners: owners.as_reader(),
            admission: AdmissionView::default(),
        };
        (cache, ChildCacheWriter { store, owners })
    }

    /// Whether a child of `namespace` was refused at the cache's bounds: a parent there may be
    /// missing a child, and is not decided on this view.
    pub fn incomplete(&self, namespace: Option<&str>) -> bool {
        self.admission.incomplete(namespace)
    }

    /// The cached children `parent` controls, ordered by name: through the owner index, so the
    /// cost is the parent's children, not the cache's size.
    ///
    /// A child is the parent's only when it lives in the parent's namespace and its controller
    /// reference carries the parent's uid: the caches are cluster-wide, and anyone who may
    /// create objects in another namespace can write any uid into an owner reference. Both are
    /// checked again on the object itself, which the index may be a moment behind.
    pub fn controlled_by(&self, parent: &DynamicObject) -> Vec<Arc<CachedChild>> {
        let uid = parent.uid().unwrap_or_default();
        let namespace = parent.namespace();
        let mut children: Vec<Arc<CachedChild>> = self
            .owners
            .children_of(&uid)
            .into_iter()
            .filter(|key| key.namespace == namespace)
            .filter_map(|key| self.store.get(&key.object_ref(&self.resource)))
            .filter(|child| {
                child.namespace() == namespace && is_controlled_by(child.as_ref(), &uid)
            })
            .collect();
        // The index is ordered already; sorting a handful again keeps the order a property of
        // this function rather than of the index's key type.
        children.sort_by_key(|o| o.name_any());
        children
    }
}

/// The label selector of a policy's child watches: the policy's label, and on a sharded host
/// the shard's ([`Shard::child_label`]), so that a shard caches only its own parents' children.
pub fn child_selector(policy: &str, shard: Shard) -> String {
    match shard.child_label() {
        Some(label) => format!(
            "{}={policy},{}={label}",
            crate::act::POLICY_LABEL,
            crate::shard::CHILD_SHARD_LABEL
        ),
        None => format!("{}={policy}", crate::act::POLICY_LABEL),
    }
}

/// The items of a cache's watch stream once cached: every event, to turn into triggers
/// (`applied_objects`, `touched_objects`).
pub type CachedEvents<K = DynamicObject> = watcher::Result<watcher::Event<K>>;

/// The items of a child cache's watch stream once cached.
pub type CachedChildEvents = CachedEvents<CachedChild>;

/// Watches `api` for the children of one declared kind (`config` carries the policy's label
/// selector) into a new [`ChildCache`] of a policy reconciling `target`, within
/// `bounds.children`. Nothing is cached until the stream is polled; the cache is ready
/// (`store.wait_until_ready`) after its first list.
pub fn watch_children(
    api: Api<CachedChild>,
    kind: KindRef,
    resource: ApiResource,
    config: watcher::Config,
    target: &KindRef,
    bounds: &CacheBounds,
) -> (
    ChildCache,
    impl Stream<Item = CachedChildEvents> + Send + 'static,
) {
    let (mut cache, mut writer) = ChildCache::new(kind.clone(), resource);
    let mut admission = Admission::children(bounds.children, target);
    cache.admission = admission.view();
    let (policy, metrics, limits) = (
        bounds.policy.clone(),
        bounds.metrics.clone(),
        bounds.children,
    );
    let name = kind.to_string();
    let stream = watcher(api, config.page_size(LIST_PAGE_SIZE))
        .default_backoff()
        .try_filter_map(move |event| {
            let (event, refusal) = admission.admit(event);
            if refusal == Some(Refusal::NotControlled) {
                metrics.cache_ignored(&policy, &name);
            }
            if refusal == Some(Refusal::Full) {
                metrics.bound_reached(
                    "child_cache",
                    &format!(
                        "the {name} cache of policy `{policy}` holds {limits:?}; a child past that was not cached, and the parents of its namespace are not decided until it fits: find who creates objects labelled policy-host.io/policy={policy} (`kubectl get {} -A -l policy-host.io/policy={policy}`) and remove them, or raise the bound",
                        name.split('.').next().unwrap_or_default()
                    ),
                );
            }
            let (objects, bytes) = admission.view().held();
            metrics.cache_held(&policy, &name, objects, bytes);
            std::future::ready(Ok(event))
        })
        .modify(|child: &mut CachedChild| drop_managed_fields(child))
        .inspect_ok(move |event| writer.apply_watcher_event(event));
    (cache, stream)
}

/// Watches `api` for the parents into a new store, as [`watch_children`] does for children,
/// keeping only the parents `shard` owns (the store, and the applied objects the controller
/// turns into reconciles, never hold another shard's parent), within `bounds.parents`.
pub fn watch_parents(
    api: Api<DynamicObject>,
    resource: ApiResource,
    config: watcher::Config,
    shard: Shard,
    bounds: &CacheBounds,
) -> (
    Store<DynamicObject>,
    impl Stream<Item = CachedEvents> + Send + 'static,
) {
    let writer = reflector::store::Writer::new(resource.clone());
    let store = writer.as_reader();
    let mut admission = Admission::parents(bounds.parents);
    let (policy, metrics, limits) = (
        bounds.policy.clone(),
        bounds.metrics.clone(),
        bounds.parents,
    );
    let stream = watcher(api, config.page_size(LIST_PAGE_SIZE))
        .default_backoff()
        .modify(|parent: &mut DynamicObject| drop_managed_fields(parent))
        .try_filter_map(move |event| std::future::ready(Ok(keep_shard(event, &shard))))
        .try_filter_map(move |event| {
            let (event, refusal) = admission.admit(event);
            if refusal.is_some() {
                metrics.bound_reached(
                    "parent_cache",
                    &format!(
                        "the parent cache of policy `{policy}` holds {limits:?}; a {} past that is not reconciled: limit who creates them (a ResourceQuota on count/{}.{}), split them among shards, or raise the bound",
                        resource.kind, resource.plural, resource.group
                    ),
                );
            }
            let (objects, bytes) = admission.view().held();
            metrics.cache_held(&policy, "parents", objects, bytes);
            std::future::ready(Ok(event))
        })
        .reflect(writer);
    (store, stream)
}

/// The watch event as `shard` passes it on, if at all. A parent of another shard is dropped
/// from a (re-)list, and its change becomes a delete: a parent whose label just moved it away
/// leaves this shard's store (a delete of one never stored changes nothing).
fn keep_shard(
    event: watcher::Event<DynamicObject>,
    shard: &Shard,
) -> Option<watcher::Event<DynamicObject>> {
    use watcher::Event;
    let owned = |parent: &DynamicObject| {
        let assignment = shard.assign_parent(parent);
        if let AssignedBy::HashOverUnusableLabel(label) = &assignment.by
            && assignment.shard == shard.index()
        {
            tracing::warn!(
                parent = %format!("{}/{}", parent.namespace().unwrap_or_default(), parent.name_any()),
                %label,
                shards = shard.count(),
                "the parent's {SHARD_LABEL} label names no shard (0 to {}); {shard} reconciles it by hash",
                shard.count() - 1
            );
        }
        assignment.shard == shard.index()
    };
    match event {
        Event::Apply(parent) if !owned(&parent) => Some(Event::Delete(parent)),
        Event::InitApply(parent) if !owned(&parent) => None,
        event => Some(event),
    }
}

/// `metadata.managedFields` are the API server's record of who set which field, a third of a
/// typical object's JSON (BENCHMARKS.md, "Throughput at scale"). The host never reads them and
/// plugins are not shown them (wit/CHANGELOG.md), so they are not kept. Set to none rather
/// than emptied: an empty list would reach the plugin as `"managedFields": []`.
fn drop_managed_fields(object: &mut impl kube::Resource) {
    object.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;

    use super::*;

    fn parent(name: &str, shard_label: Option<&str>) -> DynamicObject {
        let mut parent = DynamicObject::new(
            name,
            &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        )
        .within("prod");
        if let Some(label) = shard_label {
            parent
                .labels_mut()
                .insert(SHARD_LABEL.to_string(), label.to_string());
        }
        parent
    }

    fn kind(event: &Option<Event<DynamicObject>>) -> &'static str {
        match event {
            None => "dropped",
            Some(Event::Apply(_)) => "apply",
            Some(Event::Delete(_)) => "delete",
            Some(Event::Init) => "init",
            Some(Event::InitApply(_)) => "init-apply",
            Some(Event::InitDone) => "init-done",
        }
    }

    #[test]
    fn each_watch_event_reaches_the_store_of_its_shard_only() {
        let zero = Shard::new(0, 2).expect("a valid shard");
        // (situation, event, what shard 0's store receives)
        let rows = [
            (
                "its own parent changed",
                Event::Apply(parent("a", Some("0"))),
                "apply",
            ),
            (
                "a parent moved to shard 1 by its label leaves the store",
                Event::Apply(parent("a", Some("1"))),
                "delete",
            ),
            (
                "its own parent listed",
                Event::InitApply(parent("a", Some("0"))),
                "init-apply",
            ),
            (
                "another shard's parent listed is not stored",
                Event::InitApply(parent("a", Some("1"))),
                "dropped",
            ),
            (
                "a delete passes either way",
                Event::Delete(parent("a", Some("1"))),
                "delete",
            ),
            ("a re-list starts", Event::Init, "init"),
            ("a re-list ends", Event::InitDone, "init-done"),
        ];
        for (situation, event, expected) in rows {
            assert_eq!(kind(&keep_shard(event, &zero)), expected, "{situation}");
        }
    }

    #[test]
    fn the_only_shard_keeps_every_parent() {
        for label in [None, Some("1"), Some("x")] {
            let event = keep_shard(Event::Apply(parent("a", label)), &Shard::whole());
            assert_eq!(kind(&event), "apply", "label {label:?}");
        }
    }
}
