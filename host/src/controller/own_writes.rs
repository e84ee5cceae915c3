//! The own-write deferral: no decision on a parent view that the host's own write superseded.
//!
//! Such a reconcile is deferred until the parent cache catches up with the write (its watch
//! event normally triggers the next reconcile first); [`OwnWrites`] says why.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::PolicyController;
use super::requeue::Action as ControllerAction;

/// How soon a reconcile deferred for the host's own write (see [`OwnWrites`]) looks again if
/// the write's watch event has not triggered it sooner.
const OWN_WRITE_WAIT: Duration = Duration::from_millis(500);

/// How long a parent view superseded by the host's own write is waited out at most. The
/// write's watch event normally arrives within milliseconds; past this the view is decided
/// on anyway (a stale status write is still refused by its resourceVersion precondition).
const OWN_WRITE_PATIENCE: Duration = Duration::from_secs(30);

/// The parent views the host's own writes superseded, by parent uid: the resourceVersion the
/// host wrote the parent from. The parent cache lags such a write by one watch event, and a
/// reconcile triggered meanwhile by anything else (a child changing, a requeue) would decide
/// on the view before it. A plugin acts on its status in the decision itself (it promotes a
/// Redis replica, changes etcd's membership) before the status that records it is written:
/// on the older view it acts a second time on a state it already changed, and only its status
/// write is refused as stale, after the fact. Such a reconcile is deferred instead.
#[derive(Default)]
pub(super) struct OwnWrites(Mutex<HashMap<String, (String, Instant)>>);

impl OwnWrites {
    /// The host changed `parent` (the view it decided from) with a write of its own. Views
    /// past their patience go at the same time, so parents deleted since are not kept.
    pub(super) fn wrote(&self, parent: &DynamicObject) {
        if let (Some(uid), Some(version)) = (parent.uid(), parent.resource_version()) {
            let mut views = self.0.lock().unwrap_or_else(|p| p.into_inner());
            views.retain(|_, (_, at)| at.elapsed() < OWN_WRITE_PATIENCE);
            views.insert(uid, (version, Instant::now()));
        }
    }

    /// Whether `parent` is a view the host's own write superseded (and not for too long);
    /// a view that moved on is forgotten.
    pub(super) fn superseded(&self, parent: &DynamicObject) -> bool {
        let (Some(uid), Some(version)) = (parent.uid(), parent.resource_version()) else {
            return false;
        };
        let mut views = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match views.get(&uid) {
            Some((written_from, at))
                if *written_from == version && at.elapsed() < OWN_WRITE_PATIENCE =>
            {
                true
            }
            Some(_) => {
                views.remove(&uid);
                false
            }
            None => false,
        }
    }
}

impl PolicyController {
    /// `Some` (look again in [`OWN_WRITE_WAIT`]) when `parent` is a view the host's own write
    /// superseded: the reconcile is deferred (counted, and logged at debug).
    pub(super) fn defer_for_own_write(
        &self,
        parent: &DynamicObject,
        label: &str,
    ) -> Option<ControllerAction> {
        if !self.own_writes.superseded(parent) {
            return None;
        }
        self.metrics.reconcile_deferred(&self.policy);
        tracing::debug!(
            parent = %label,
            resource_version = parent.resource_version().as_deref().unwrap_or_default(),
            "deferred: the cached parent predates the host's own write to it"
        );
        Some(ControllerAction::requeue(OWN_WRITE_WAIT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ApiResource;

    fn parent_at(uid: &str, version: &str) -> DynamicObject {
        let mut parent = DynamicObject::new(
            uid,
            &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        parent.metadata.uid = Some(uid.into());
        parent.metadata.resource_version = Some(version.into());
        parent
    }

    #[test]
    fn a_view_the_hosts_own_write_superseded_is_deferred_until_the_cache_moves_on() {
        let own = OwnWrites::default();
        assert!(
            !own.superseded(&parent_at("a", "10")),
            "nothing written yet"
        );
        own.wrote(&parent_at("a", "10"));
        assert!(
            own.superseded(&parent_at("a", "10")),
            "the view written from"
        );
        assert!(
            own.superseded(&parent_at("a", "10")),
            "still, until the cache moves"
        );
        assert!(!own.superseded(&parent_at("b", "10")), "another parent");
        assert!(
            !own.superseded(&parent_at("a", "11")),
            "the view as written"
        );
        assert!(
            !own.superseded(&parent_at("a", "10")),
            "forgotten once the cache moved on"
        );
    }
}
