//! What a watch cache lets in: the bound on what anyone outside the host can make it hold.
//!
//! The child caches are cluster-wide and select by the label `policy-host.io/policy=<name>`,
//! which anyone may set on their own objects; the parent cache holds every object of the
//! target kind. Without a bound a tenant with `edit` in any namespace makes the host hold
//! whatever they create (review H3: 3,000 labelled PodDisruptionBudgets with 250 KiB of
//! annotations each, and leader and standby are OOM-killed in turn). So, event by event,
//! before the store sees it:
//!
//! - a child is kept only when its controller reference names the policy's target kind (group
//!   and kind; the version may differ): nothing else can ever be a parent's child
//!   ([`super::cache::ChildCache::controlled_by`]), so nothing else is kept, not even its
//!   metadata. A kept child that loses that reference leaves the cache.
//! - a cache holds at most [`CacheLimits::objects`] objects and [`CacheLimits::bytes`] bytes
//!   (the object's JSON size, approximately: what its strings weigh). First come, first kept:
//!   an object past either bound is refused (a stored one whose update is refused leaves the
//!   cache), counted in `policy_host_bounds_reached_total` and logged as a warning.
//! - a namespace in which a child was refused is *incomplete*: a parent there could be missing
//!   a child, and a plugin deciding on that view would recreate or write off what exists, so
//!   its parents are not decided (a `ChildCacheFull` failure) until a re-list finds every
//!   object of the namespace within the bounds. Other namespaces go on.
//!
//! A re-list is admitted afresh beside the objects it replaces (the store swaps at its end),
//! so a cache holds at most twice its bounds for that moment; objects are read in pages
//! ([`LIST_PAGE_SIZE`]), so a list of large refused objects passes through a page at a time.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use kube::Resource;
use kube::ResourceExt;
use kube::core::ObjectMeta;
use kube::runtime::watcher::Event;

use super::child::CachedChild;
use crate::contract::KindRef;

/// Objects per LIST page of the host's watches: a page is read whole before its objects are
/// admitted, so the page size bounds what refused objects cost on the way through (50 objects
/// with the 256 KiB of annotations the API server allows are 12.5 MiB; kube's default page is
/// 500). A cache of 20,000 objects lists in 400 requests.
pub const LIST_PAGE_SIZE: u32 = 50;

/// How much one watch cache may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Objects held at most.
    pub objects: usize,
    /// Bytes held at most, as [`footprint`] counts them.
    pub bytes: usize,
}

impl CacheLimits {
    /// No bound (a bench that measures a cache's full size).
    pub const UNBOUNDED: CacheLimits = CacheLimits {
        objects: usize::MAX,
        bytes: usize::MAX,
    };
}

/// The bounds of each child cache (one per declared kind): 20,000 objects, 64 MiB. 1,000
/// three-member etcd clusters hold 3,000 Pods of ~4 KiB in the largest cache (BENCHMARKS.md,
/// "Throughput at scale"), so about 6,000 clusters fit; at the bounds, one cache costs the
/// host about 120 MiB resident (text plus metadata, keys and the owner index).
pub const DEFAULT_CHILD_LIMITS: CacheLimits = CacheLimits {
    objects: 20_000,
    bytes: 64 << 20,
};

/// The bounds of a policy's parent cache: 20,000 parents, 64 MiB.
pub const DEFAULT_PARENT_LIMITS: CacheLimits = CacheLimits {
    objects: 20_000,
    bytes: 64 << 20,
};

/// Approximately what an object takes as JSON: its metadata's strings plus `body`'s bytes.
/// Cheap to compute (no serialization) and the same for an object each time it is seen, so
/// what a cache counts in and out balances.
pub fn footprint(meta: &ObjectMeta, body: usize) -> usize {
    let pairs = |map: &Option<std::collections::BTreeMap<String, String>>| {
        map.iter()
            .flatten()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum::<usize>()
    };
    let strings =
        |list: &Option<Vec<String>>| list.iter().flatten().map(|s| s.len() + 3).sum::<usize>();
    let owners: usize = meta
        .owner_references
        .iter()
        .flatten()
        .map(|r| r.api_version.len() + r.kind.len() + r.name.len() + r.uid.len() + 80)
        .sum();
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    // Field names, timestamps and punctuation: what every object carries besides its strings.
    const FIXED: usize = 200;
    FIXED
        + body
        + pairs(&meta.annotations)
        + pairs(&meta.labels)
        + strings(&meta.finalizers)
        + owners
        + text(&meta.name)
        + text(&meta.namespace)
        + text(&meta.uid)
        + text(&meta.resource_version)
        + text(&meta.generate_name)
}

/// What a child weighs in its cache.
pub fn child_footprint(child: &CachedChild) -> usize {
    footprint(&child.metadata, child.body().len())
}

/// What a parent weighs in its cache.
pub fn parent_footprint(parent: &kube::api::DynamicObject) -> usize {
    footprint(&parent.metadata, value_size(&parent.data))
}

/// About the bytes `value` takes as JSON, without writing it out.
fn value_size(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 20,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| k.len() + 4 + value_size(v))
                .sum::<usize>()
        }
    }
}

/// Where an object is: namespace and name.
type Key = (Option<String>, String);

/// What a cache holds, by object, and the namespaces where something was refused.
#[derive(Debug, Default)]
struct Held {
    sizes: HashMap<Key, usize>,
    bytes: usize,
    incomplete: BTreeSet<Option<String>>,
}

impl Held {
    /// Takes `size` in for `key` if the bounds allow; false (and nothing changed) if not.
    fn take(&mut self, key: Key, size: usize, limits: CacheLimits) -> bool {
        let before = self.sizes.get(&key).copied();
        let objects = self.sizes.len() + usize::from(before.is_none());
        let bytes = self.bytes - before.unwrap_or(0) + size;
        if objects > limits.objects || bytes > limits.bytes {
            return false;
        }
        self.sizes.insert(key, size);
        self.bytes = bytes;
        true
    }

    fn remove(&mut self, key: &Key) -> bool {
        match self.sizes.remove(key) {
            Some(size) => {
                self.bytes -= size;
                true
            }
            None => false,
        }
    }
}

/// What a cache holds, for readers: counts for the metrics, incomplete namespaces for the
/// controller.
#[derive(Clone, Debug, Default)]
pub struct AdmissionView {
    shared: Arc<RwLock<Shared>>,
}

#[derive(Debug, Default)]
struct Shared {
    objects: usize,
    bytes: usize,
    incomplete: BTreeSet<Option<String>>,
}

impl AdmissionView {
    /// Whether an object of `namespace` was refused, so the cache may lack some of its objects.
    pub fn incomplete(&self, namespace: Option<&str>) -> bool {
        self.read()
            .incomplete
            .contains(&namespace.map(str::to_owned))
    }

    /// Objects and bytes held.
    pub fn held(&self) -> (usize, usize) {
        let shared = self.read();
        (shared.objects, shared.bytes)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Shared> {
        // Poisoned only by a panic in this module's short critical sections.
        self.shared.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why an object was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its controller reference names no object of the target kind.
    NotControlled,
    /// The cache is at its bounds.
    Full,
}

/// Admits a watch stream's events into one cache, within its bounds.
pub struct Admission<K> {
    limits: CacheLimits,
    /// For a child cache, the target kind its objects' controller must be.
    controller_kind: Option<(String, String)>,
    size: fn(&K) -> usize,
    live: Held,
    /// What a (re-)list admits, swapped in at its end as the store swaps.
    listing: Option<Held>,
    view: AdmissionView,
}

impl<K: Resource> Admission<K> {
    fn with(limits: CacheLimits, controller_kind: Option<&KindRef>, size: fn(&K) -> usize) -> Self {
        Self {
            limits,
            controller_kind: controller_kind.map(|k| (k.group.clone(), k.kind.clone())),
            size,
            live: Held::default(),
            listing: None,
            view: AdmissionView::default(),
        }
    }

    /// What readers see of this cache.
    pub fn view(&self) -> AdmissionView {
        self.view.clone()
    }

    fn controlled(&self, object: &K) -> bool {
        let Some((group, kind)) = &self.controller_kind else {
            return true;
        };
        object
            .meta()
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
            .is_some_and(|r| {
                let owner_group = r.api_version.rsplit_once('/').map_or("", |(g, _)| g);
                owner_group == group && r.kind == *kind
            })
    }

    /// The event as the store should see it, if at all, and why an object was refused.
    pub fn admit(&mut self, event: Event<K>) -> (Option<Event<K>>, Option<Refusal>) {
        let outcome = match event {
            Event::Apply(object) => {
                let key = key_of(&object);
                let refusal = self.check(&object, |held, size, limits| {
                    held.take(key.clone(), size, limits)
                });
                match refusal {
                    None => (Some(Event::Apply(object)), None),
                    // Refused: a stored version leaves the store with it.
                    Some(refusal) if self.live.remove(&key) => {
                        (Some(Event::Delete(object)), Some(refusal))
                    }
                    Some(refusal) => (None, Some(refusal)),
                }
            }
            Event::Delete(object) => {
                self.live.remove(&key_of(&object));
                (Some(Event::Delete(object)), None)
            }
            Event::Init => {
                self.listing = Some(Held::default());
                (Some(Event::Init), None)
            }
            Event::InitApply(object) => {
                let key = key_of(&object);
                let (limits, size) = (self.limits, (self.size)(&object));
                let controlled = self.controlled(&object);
                let listing = self.listing.get_or_insert_with(Held::default);
                if !controlled {
                    (None, Some(Refusal::NotControlled))
                } else if listing.take(key.clone(), size, limits) {
                    (Some(Event::InitApply(object)), None)
                } else {
                    listing.incomplete.insert(key.0);
                    (None, Some(Refusal::Full))
                }
            }
            Event::InitDone => {
                self.live = self.listing.take().unwrap_or_default();
                (Some(Event::InitDone), None)
            }
        };
        let mut shared = self.view.shared.write().unwrap_or_else(|p| p.into_inner());
        shared.objects = self.live.sizes.len();
        shared.bytes = self.live.bytes;
        shared.incomplete.clone_from(&self.live.incomplete);
        outcome
    }

    /// Runs the checks for an applied object: its controller, then `take` within the bounds.
    /// A refusal for the bounds marks its namespace incomplete.
    fn check(
        &mut self,
        object: &K,
        take: impl FnOnce(&mut Held, usize, CacheLimits) -> bool,
    ) -> Option<Refusal> {
        if !self.controlled(object) {
            return Some(Refusal::NotControlled);
        }
        let size = (self.size)(object);
        if take(&mut self.live, size, self.limits) {
            return None;
        }
        self.live.incomplete.insert(object.namespace());
        Some(Refusal::Full)
    }
}

impl Admission<CachedChild> {
    /// The admission of a child cache of a policy whose target kind is `target`.
    pub fn children(limits: CacheLimits, target: &KindRef) -> Self {
        Self::with(limits, Some(target), child_footprint)
    }
}

impl Admission<kube::api::DynamicObject> {
    /// The admission of a parent cache.
    pub fn parents(limits: CacheLimits) -> Self {
        Self::with(limits, None, parent_footprint)
    }
}

fn key_of(object: &impl Resource) -> Key {
    (object.meta().namespace.clone(), object.name_any())
}

#[cfg(test)]
mod tests {
    //! In-memory: watch events built by hand, no API server.

    use super::*;

    fn target() -> KindRef {
        KindRef {
            group: "test.policy-host.io".into(),
            version: "v1".into(),
            kind: "Probe".into(),
            plural: "probes".into(),
            namespaced: true,
        }
    }

    /// A labelled ConfigMap in `namespace`, controlled by `controller` (apiVersion, kind) if
    /// given, with `annotation_bytes` of annotations.
    fn child(
        namespace: &str,
        name: &str,
        controller: Option<(&str, &str)>,
        annotation_bytes: usize,
    ) -> CachedChild {
        let owners: Vec<serde_json::Value> = controller
            .map(|(api_version, kind)| {
                serde_json::json!({"apiVersion": api_version, "kind": kind, "name": "p",
                    "uid": "parent-uid", "controller": true})
            })
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "ownerReferences": owners,
                "labels": {"policy-host.io/policy": "probe"},
                "annotations": {"big": "x".repeat(annotation_bytes)}},
            "data": {"k": "v"},
        }))
        .expect("a valid ConfigMap")
    }

    const PROBE: Option<(&str, &str)> = Some(("test.policy-host.io/v1", "Probe"));

    fn kind(event: &Option<Event<CachedChild>>) -> &'static str {
        match event {
            None => "dropped",
            Some(Event::Apply(_)) => "apply",
            Some(Event::Delete(_)) => "delete",
            Some(Event::Init) => "init",
            Some(Event::InitApply(_)) => "init-apply",
            Some(Event::InitDone) => "init-done",
        }
    }

    /// Each row: the events given in order, what the last one becomes, and what the cache
    /// then holds (objects) and whether namespace `ns` is incomplete.
    #[test]
    fn a_child_cache_admits_only_controlled_children_within_its_bounds() {
        let limits = CacheLimits {
            objects: 3,
            bytes: 20_000,
        };
        type Row = (
            &'static str,
            Vec<Event<CachedChild>>,
            &'static str,
            usize,
            bool,
        );
        let rows: Vec<Row> = vec![
            (
                "a child controlled by a parent of the target kind is kept",
                vec![Event::Apply(child("ns", "a", PROBE, 10))],
                "apply",
                1,
                false,
            ),
            (
                "another version of the target kind counts",
                vec![Event::Apply(child(
                    "ns",
                    "a",
                    Some(("test.policy-host.io/v2", "Probe")),
                    10,
                ))],
                "apply",
                1,
                false,
            ),
            (
                "a labelled object without a controller is not kept",
                vec![Event::Apply(child("ns", "a", None, 10))],
                "dropped",
                0,
                false,
            ),
            (
                "a controller of another kind does not count",
                vec![Event::Apply(child(
                    "ns",
                    "a",
                    Some(("apps/v1", "Deployment")),
                    10,
                ))],
                "dropped",
                0,
                false,
            ),
            (
                "the target's kind name in another group does not count",
                vec![Event::Apply(child(
                    "ns",
                    "a",
                    Some(("evil.io/v1", "Probe")),
                    10,
                ))],
                "dropped",
                0,
                false,
            ),
            (
                "a kept child that loses its controller leaves the cache",
                vec![
                    Event::Apply(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("ns", "a", None, 10)),
                ],
                "delete",
                0,
                false,
            ),
            (
                "a child past the object bound is refused and its namespace is incomplete",
                vec![
                    Event::Apply(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("ns", "b", PROBE, 10)),
                    Event::Apply(child("ns", "c", PROBE, 10)),
                    Event::Apply(child("ns", "d", PROBE, 10)),
                ],
                "dropped",
                3,
                true,
            ),
            (
                "a child past the byte bound is refused",
                vec![
                    Event::Apply(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("ns", "b", PROBE, 30_000)),
                ],
                "dropped",
                1,
                true,
            ),
            (
                "a kept child whose update is past the bound leaves the cache",
                vec![
                    Event::Apply(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("ns", "a", PROBE, 30_000)),
                ],
                "delete",
                0,
                true,
            ),
            (
                "an update of a kept child at the object bound is kept",
                vec![
                    Event::Apply(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("ns", "b", PROBE, 10)),
                    Event::Apply(child("ns", "c", PROBE, 10)),
                    Event::Apply(child("ns", "c", PROBE, 20)),
                ],
                "apply",
                3,
                false,
            ),
            (
                "a delete frees its place",
                vec![
                    Event::Apply(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("ns", "b", PROBE, 10)),
                    Event::Apply(child("ns", "c", PROBE, 10)),
                    Event::Delete(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("ns", "d", PROBE, 10)),
                ],
                "apply",
                3,
                false,
            ),
            (
                "a refusal in another namespace leaves ns complete",
                vec![
                    Event::Apply(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("other", "b", PROBE, 30_000)),
                ],
                "dropped",
                1,
                false,
            ),
            (
                "a list keeps only what is controlled, within the bounds",
                vec![
                    Event::Init,
                    Event::InitApply(child("ns", "a", PROBE, 10)),
                    Event::InitApply(child("ns", "loose", None, 100_000)),
                    Event::InitApply(child("ns", "b", PROBE, 10)),
                    Event::InitDone,
                ],
                "init-done",
                2,
                false,
            ),
            (
                "an object past the bounds in a list is dropped and its namespace incomplete",
                vec![
                    Event::Init,
                    Event::InitApply(child("ns", "a", PROBE, 10)),
                    Event::InitApply(child("ns", "b", PROBE, 30_000)),
                    Event::InitDone,
                ],
                "init-done",
                1,
                true,
            ),
            (
                "a re-list within the bounds makes the namespace complete again",
                vec![
                    Event::Apply(child("ns", "a", PROBE, 10)),
                    Event::Apply(child("ns", "b", PROBE, 30_000)),
                    Event::Init,
                    Event::InitApply(child("ns", "a", PROBE, 10)),
                    Event::InitDone,
                ],
                "init-done",
                1,
                false,
            ),
        ];
        for (situation, events, last, objects, incomplete) in rows {
            let mut admission = Admission::children(limits, &target());
            let view = admission.view();
            let mut outcome = None;
            for event in events {
                outcome = admission.admit(event).0;
            }
            assert_eq!(kind(&outcome), last, "{situation}");
            assert_eq!(view.held().0, objects, "{situation}");
            assert_eq!(view.incomplete(Some("ns")), incomplete, "{situation}");
        }
    }

    /// What a tenant with `edit` can do to a cache without parents (review H3): thousands of
    /// labelled objects with the largest annotations the API server takes. None of them is
    /// kept, so the cache holds nothing whatever they weigh.
    #[test]
    fn labelled_objects_no_parent_controls_are_not_retained() {
        let mut admission = Admission::children(DEFAULT_CHILD_LIMITS, &target());
        let view = admission.view();
        let mut kept = 0;
        admission.admit(Event::Init);
        for n in 0..1_000 {
            let hostile = child("tenant", &format!("pdb-{n}"), None, 250 << 10);
            kept += usize::from(admission.admit(Event::InitApply(hostile)).0.is_some());
        }
        admission.admit(Event::InitDone);
        for n in 1_000..3_000 {
            let hostile = child("tenant", &format!("pdb-{n}"), None, 250 << 10);
            kept += usize::from(admission.admit(Event::Apply(hostile)).0.is_some());
        }
        assert_eq!(kept, 0);
        assert_eq!(view.held(), (0, 0));
        assert!(
            !view.incomplete(Some("tenant")),
            "nothing a parent could miss"
        );
    }

    /// Objects claiming a parent of the target kind (anyone can write such a reference) fill
    /// the cache only up to its bounds.
    #[test]
    fn forged_controller_references_fill_a_cache_only_to_its_bounds() {
        let mut admission = Admission::children(DEFAULT_CHILD_LIMITS, &target());
        let view = admission.view();
        for n in 0..3_000 {
            let forged = child("tenant", &format!("pdb-{n}"), PROBE, 250 << 10);
            admission.admit(Event::Apply(forged));
        }
        let (objects, bytes) = view.held();
        assert!(bytes <= DEFAULT_CHILD_LIMITS.bytes, "{bytes}");
        // 64 MiB of 250 KiB objects: 262 at most, a few fewer for their other fields.
        assert!((250..=262).contains(&objects), "{objects}");
        assert!(view.incomplete(Some("tenant")));
        assert!(!view.incomplete(Some("elsewhere")));
    }

    #[test]
    fn the_footprint_follows_the_json_size() {
        for annotation in [0, 1_000, 100_000] {
            let object = child("ns", "a", PROBE, annotation);
            let json = object.to_json().expect("json").len();
            let counted = child_footprint(&object);
            assert!(
                counted >= json / 2 && counted <= json * 2 + 400,
                "{annotation}: counted {counted}, JSON {json}"
            );
        }
    }
}
