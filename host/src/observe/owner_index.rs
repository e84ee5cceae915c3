//! The owner index: for one child kind, which cached objects each controller (by uid) owns,
//! kept from the same watch events as the child cache so that observing a parent reads its
//! own children instead of scanning every cached object.
//!
//! It follows a kube-rs reflector `Writer` event by event: `Apply` and `Delete` change the live
//! index at once; a (re-)list (`Init`, `InitApply`…, `InitDone`) builds a new index aside and
//! swaps it in whole at `InitDone`, as the store swaps its objects, so an object missing from
//! the new list leaves the index at the same moment it leaves the cache.
//!
//! The index holds names only; the objects stay in the store. That costs a hash lookup per
//! child when observing and nothing when the objects change size.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use kube::ResourceExt;
use kube::api::ApiResource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::child::CachedChild;

/// Where a child is: namespace (none for a cluster-scoped kind) and name. Ordered by name
/// first, the order observations list a parent's children in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChildKey {
    /// The child's name.
    pub name: String,
    /// The child's namespace; `None` for a cluster-scoped kind.
    pub namespace: Option<String>,
}

impl ChildKey {
    fn of(object: &CachedChild) -> Self {
        Self {
            name: object.name_any(),
            namespace: object.namespace(),
        }
    }

    /// The reference the child's store files it under.
    pub fn object_ref(&self, resource: &ApiResource) -> ObjectRef<CachedChild> {
        let reference = ObjectRef::new_with(&self.name, resource.clone());
        match &self.namespace {
            Some(namespace) => reference.within(namespace),
            None => reference,
        }
    }
}

/// Owner uid → children, and the way back, for one child kind.
#[derive(Debug, Default)]
struct Owners {
    children: HashMap<String, BTreeSet<ChildKey>>,
    /// The controller uid each indexed child was filed under: an `Apply` that moves a child to
    /// another controller, or drops its controller reference, must take it out of the old set,
    /// and the old uid is no longer in the object.
    owner_of: HashMap<ChildKey, String>,
}

impl Owners {
    /// Files `object` under its controller's uid (if it has one), out of wherever it was.
    fn apply(&mut self, object: &CachedChild) {
        let key = ChildKey::of(object);
        let owner = controller_uid(object);
        if self.owner_of.get(&key) == owner.as_ref() {
            return;
        }
        self.remove(&key);
        if let Some(owner) = owner {
            self.children
                .entry(owner.clone())
                .or_default()
                .insert(key.clone());
            self.owner_of.insert(key, owner);
        }
    }

    fn remove(&mut self, key: &ChildKey) {
        let Some(owner) = self.owner_of.remove(key) else {
            return;
        };
        if let Some(children) = self.children.get_mut(&owner) {
            children.remove(key);
            // An owner with no children left takes no room: parents come and go by the
            // thousand.
            if children.is_empty() {
                self.children.remove(&owner);
            }
        }
    }
}

/// The uid in the object's controller owner reference (the one with `controller: true`; the
/// API server allows at most one).
fn controller_uid(object: &CachedChild) -> Option<String> {
    object
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.clone())
}

/// The read side of an owner index: cheap to clone, shared with every reconcile.
#[derive(Clone, Debug, Default)]
pub struct OwnerIndex {
    live: Arc<RwLock<Owners>>,
}

impl OwnerIndex {
    /// The children whose controller reference carries `owner_uid`, in any namespace, ordered
    /// by name. The uid is only what the children claim: the caller checks the namespace.
    pub fn children_of(&self, owner_uid: &str) -> Vec<ChildKey> {
        self.read()
            .children
            .get(owner_uid)
            .map(|children| children.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// How many children are indexed, under any owner.
    pub fn len(&self) -> usize {
        self.read().owner_of.len()
    }

    /// True when no child is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Owners> {
        // Poisoned only by a panic inside this module's short critical sections, which leave
        // the maps consistent: keep serving.
        self.live.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// The write side of an owner index: applies one watch stream's events, as a kube-rs reflector
/// `Writer` does for the store next to it.
#[derive(Debug, Default)]
pub struct OwnerIndexWriter {
    live: Arc<RwLock<Owners>>,
    /// The index being built by a (re-)list, swapped in at `InitDone`.
    listing: Option<Owners>,
}

impl OwnerIndexWriter {
    /// A writer with an empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The index this writer keeps.
    pub fn as_reader(&self) -> OwnerIndex {
        OwnerIndex {
            live: self.live.clone(),
        }
    }

    /// Applies one watch event.
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<CachedChild>) {
        match event {
            watcher::Event::Apply(object) => self.write().apply(object),
            watcher::Event::Delete(object) => self.write().remove(&ChildKey::of(object)),
            watcher::Event::Init => self.listing = Some(Owners::default()),
            watcher::Event::InitApply(object) => {
                self.listing
                    .get_or_insert_with(Owners::default)
                    .apply(object);
            }
            watcher::Event::InitDone => {
                // Children that were not listed again are gone: the new list replaces the
                // index whole, it is not merged into it.
                let listed = self.listing.take().unwrap_or_default();
                *self.write() = listed;
            }
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Owners> {
        self.live.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    //! In-memory: watch events built by hand, no API server.

    use super::*;
    use watcher::Event;

    fn pod(namespace: &str, name: &str, controller_uid: Option<&str>) -> CachedChild {
        let owners: Vec<serde_json::Value> = controller_uid
            .map(|uid| {
                serde_json::json!({"apiVersion": "v1", "kind": "Owner", "name": "owner",
                    "uid": uid, "controller": true})
            })
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "ownerReferences": owners},
        }))
        .expect("a valid pod")
    }

    fn names(index: &OwnerIndex, owner: &str) -> Vec<String> {
        index
            .children_of(owner)
            .into_iter()
            .map(|k| format!("{}/{}", k.namespace.unwrap_or_default(), k.name))
            .collect()
    }

    /// Each row: the events applied in order, then the children expected per owner uid.
    #[test]
    fn the_index_follows_the_watch_events() {
        type Row = (
            &'static str,
            Vec<Event<CachedChild>>,
            Vec<(&'static str, Vec<&'static str>)>,
        );
        let rows: Vec<Row> = vec![
            (
                "applied children are listed under their controller, ordered by name",
                vec![
                    Event::Apply(pod("ns", "db-1", Some("a"))),
                    Event::Apply(pod("ns", "db-0", Some("a"))),
                    Event::Apply(pod("ns", "web-0", Some("b"))),
                ],
                vec![("a", vec!["ns/db-0", "ns/db-1"]), ("b", vec!["ns/web-0"])],
            ),
            (
                "a child without a controller reference is not indexed",
                vec![Event::Apply(pod("ns", "loose", None))],
                vec![("a", vec![])],
            ),
            (
                "a non-controller owner reference does not count",
                vec![Event::Apply({
                    let mut p = pod("ns", "shared", Some("a"));
                    p.metadata.owner_references.as_mut().expect("refs")[0].controller = None;
                    p
                })],
                vec![("a", vec![])],
            ),
            (
                "a deleted child leaves its owner",
                vec![
                    Event::Apply(pod("ns", "db-0", Some("a"))),
                    Event::Apply(pod("ns", "db-1", Some("a"))),
                    Event::Delete(pod("ns", "db-0", Some("a"))),
                ],
                vec![("a", vec!["ns/db-1"])],
            ),
            (
                "a child whose controller changes moves to the new owner",
                vec![
                    Event::Apply(pod("ns", "db-0", Some("a"))),
                    Event::Apply(pod("ns", "db-0", Some("b"))),
                ],
                vec![("a", vec![]), ("b", vec!["ns/db-0"])],
            ),
            (
                "a child that loses its controller reference leaves the index",
                vec![
                    Event::Apply(pod("ns", "db-0", Some("a"))),
                    Event::Apply(pod("ns", "db-0", None)),
                ],
                vec![("a", vec![])],
            ),
            (
                "a delete whose object no longer names the owner still removes the child",
                vec![
                    Event::Apply(pod("ns", "db-0", Some("a"))),
                    Event::Delete(pod("ns", "db-0", None)),
                ],
                vec![("a", vec![])],
            ),
            (
                "same name in two namespaces: two children",
                vec![
                    Event::Apply(pod("team-a", "db-0", Some("a"))),
                    Event::Apply(pod("team-b", "db-0", Some("a"))),
                ],
                vec![("a", vec!["team-a/db-0", "team-b/db-0"])],
            ),
            (
                "a re-list replaces the index: children not listed again are gone",
                vec![
                    Event::Apply(pod("ns", "db-0", Some("a"))),
                    Event::Apply(pod("ns", "db-1", Some("a"))),
                    Event::Apply(pod("ns", "web-0", Some("b"))),
                    Event::Init,
                    Event::InitApply(pod("ns", "db-1", Some("a"))),
                    Event::InitApply(pod("ns", "db-2", Some("c"))),
                    Event::InitDone,
                ],
                vec![
                    ("a", vec!["ns/db-1"]),
                    ("b", vec![]),
                    ("c", vec!["ns/db-2"]),
                ],
            ),
            (
                "a re-list can move a child to another owner",
                vec![
                    Event::Apply(pod("ns", "db-0", Some("a"))),
                    Event::Init,
                    Event::InitApply(pod("ns", "db-0", Some("b"))),
                    Event::InitDone,
                ],
                vec![("a", vec![]), ("b", vec!["ns/db-0"])],
            ),
            (
                "an empty re-list empties the index",
                vec![
                    Event::Apply(pod("ns", "db-0", Some("a"))),
                    Event::Init,
                    Event::InitDone,
                ],
                vec![("a", vec![])],
            ),
        ];
        for (situation, events, want) in rows {
            let mut writer = OwnerIndexWriter::new();
            let index = writer.as_reader();
            for event in &events {
                writer.apply_watcher_event(event);
            }
            for (owner, children) in want {
                assert_eq!(names(&index, owner), children, "{situation}: owner {owner}");
            }
        }
    }

    /// The store keeps serving the old objects until the new list is complete; so must the
    /// index, or a parent observed mid-list looks childless.
    #[test]
    fn the_old_index_serves_until_the_relist_is_done() {
        let mut writer = OwnerIndexWriter::new();
        let index = writer.as_reader();
        writer.apply_watcher_event(&Event::Apply(pod("ns", "db-0", Some("a"))));
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(pod("ns", "db-9", Some("a"))));
        assert_eq!(names(&index, "a"), ["ns/db-0"], "mid-list");
        writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(names(&index, "a"), ["ns/db-9"], "after the list");
    }

    /// Owners that lose their last child take no room, and the count follows the children.
    #[test]
    fn owners_without_children_are_forgotten() {
        let mut writer = OwnerIndexWriter::new();
        let index = writer.as_reader();
        for i in 0..100 {
            let owner = format!("owner-{i}");
            writer.apply_watcher_event(&Event::Apply(pod("ns", &format!("p{i}"), Some(&owner))));
        }
        assert_eq!(index.len(), 100);
        for i in 0..100 {
            writer.apply_watcher_event(&Event::Delete(pod("ns", &format!("p{i}"), None)));
        }
        assert!(index.is_empty());
        assert!(
            writer.write().children.is_empty(),
            "no empty owner sets left"
        );
    }
}
