//! Rollout dispatch: which version decides for a parent while its kind has a staged rollout,
//! an Event on the parent when that changes, and each outcome tallied for the rollback
//! judgement ([`crate::rollout`]).
//!
//! The controller is the active plugin's; a rollout only changes which plugin one reconcile
//! runs. Every parent's version is remembered (for as long as the parent is cached), so a move
//! in either direction is an Event on the parent, and the rollout's census (which parents run
//! which version) follows the reconciles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::{PolicyController, ReconcileError};
use crate::act::ActError;
use crate::contract::{Event, EventType};
use crate::decide::DecideError;
use crate::policy_store::{LoadedPolicy, LoadedRollout};
use crate::rollout::{Blame, Census, MAX_LISTED_PARENTS, Verdict};

/// The version one reconcile runs, and the rollout it was chosen under.
pub(super) struct Version {
    /// The plugin that decides.
    pub(super) loaded: Arc<LoadedPolicy>,
    /// The rollout of the kind, running or rolled back (its tally counts the outcome while it
    /// runs).
    rollout: Option<Arc<LoadedRollout>>,
    /// Whether `loaded` is the rollout's candidate.
    candidate: bool,
}

/// Which version last decided for a parent.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Placement {
    /// `namespace/name`.
    parent: String,
    /// The plugin's component sha256.
    sha256: String,
    /// The plugin's `name@version`.
    label: String,
    /// Whether it was a rollout's candidate.
    candidate: bool,
}

/// Every cached parent's version, by uid: forgotten when the parent leaves the cache.
#[derive(Default)]
pub(super) struct Placements(Mutex<PlacementBook>);

#[derive(Default)]
struct PlacementBook {
    by_uid: HashMap<String, Placement>,
    /// A placement changed since the census was last published.
    dirty: bool,
    /// The rollout the census was last published for (its address).
    published_for: usize,
}

impl Placements {
    /// Records `placement` for `uid`; returns the previous one.
    fn place(&self, uid: &str, placement: Placement) -> Option<Placement> {
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let previous = book.by_uid.insert(uid.to_string(), placement.clone());
        if previous.as_ref() != Some(&placement) {
            book.dirty = true;
        }
        previous
    }

    /// Forgets the parent with `uid` (deleted, or moved to another shard).
    pub(super) fn forget(&self, uid: &str) {
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if book.by_uid.remove(uid).is_some() {
            book.dirty = true;
        }
    }

    /// Keeps only the parents whose uid `keep` accepts (a re-list's end).
    pub(super) fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let before = book.by_uid.len();
        book.by_uid.retain(|uid, _| keep(uid));
        if book.by_uid.len() != before {
            book.dirty = true;
        }
    }

    /// The census for `rollout` whose candidate has component `candidate_sha256`, when it
    /// changed since it was last published (or the rollout is another one).
    fn census_due(&self, rollout: usize, candidate_sha256: &str) -> Option<Census> {
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !book.dirty && book.published_for == rollout {
            return None;
        }
        book.dirty = false;
        book.published_for = rollout;
        let on_candidate = |p: &&Placement| p.candidate && p.sha256 == candidate_sha256;
        let mut listed: Vec<String> = book
            .by_uid
            .values()
            .filter(on_candidate)
            .map(|p| p.parent.clone())
            .collect();
        let candidate = listed.len();
        listed.sort();
        listed.truncate(MAX_LISTED_PARENTS);
        Some(Census {
            candidate,
            active: book.by_uid.len() - candidate,
            on_candidate: listed,
        })
    }

    #[cfg(test)]
    pub(super) fn placed_for_test(&self, uid: &str) {
        self.place(
            uid,
            Placement {
                parent: format!("test/{uid}"),
                sha256: "sha".into(),
                label: "test@1".into(),
                candidate: false,
            },
        );
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_uid
            .len()
    }
}

/// Whether a reconcile's outcome counts against the version that decided (module docs of
/// [`crate::rollout`]): `decided` is `Some(degraded)` once the plugin decided, `degraded` when
/// its status turned the parent's `Degraded` condition on.
fn blame(outcome: &Result<(), &ReconcileError>, decided: Option<bool>) -> Blame {
    match outcome {
        Ok(()) => match decided {
            Some(true) => Blame::Failed,
            Some(false) => Blame::Succeeded,
            None => Blame::NotCounted,
        },
        Err(ReconcileError::Decide(DecideError::SandboxBusy { .. })) => Blame::NotCounted,
        Err(ReconcileError::Decide(_)) => Blame::Failed,
        Err(ReconcileError::Act(ActError::Refused { .. } | ActError::NotControlled { .. })) => {
            Blame::Failed
        }
        // An object the API server finds invalid is the decision's; a 422 about a uid is a
        // stale view, classified before it gets here.
        Err(ReconcileError::Act(ActError::Api {
            source: kube::Error::Api(status),
            ..
        })) if status.code == 422 => Blame::Failed,
        Err(_) => Blame::NotCounted,
    }
}

impl PolicyController {
    /// The version that decides for `parent` now: the rollout's candidate if a running rollout
    /// of the kind selects it, the active plugin otherwise. A parent whose version changed
    /// gets an Event saying which and why.
    pub(super) async fn version_for(
        &self,
        parent: &DynamicObject,
    ) -> Result<Version, ReconcileError> {
        let active = self
            .store
            .get(&self.policy)
            .ok_or_else(|| ReconcileError::PolicyGone(self.policy.clone()))?;
        let rollout = self
            .store
            .rollout_for(&active.plugin.info().target)
            .filter(|r| r.fits(&active));
        let uid = parent.uid().unwrap_or_default();
        let selected = rollout
            .as_ref()
            .filter(|r| r.state.rolled_back().is_none())
            .and_then(|r| {
                r.spec
                    .selects(parent.labels(), Some(uid.as_str()))
                    .map(|s| (r, s))
            });
        let (loaded, why) = match selected {
            Some((rollout, why)) => (rollout.policy.clone(), Some(why)),
            None => (active, None),
        };
        let candidate = why.is_some();
        let placement = Placement {
            parent: format!(
                "{}/{}",
                parent.namespace().unwrap_or_default(),
                parent.name_any()
            ),
            sha256: loaded.plugin.content_sha256().to_string(),
            label: loaded.plugin.label().to_string(),
            candidate,
        };
        let previous = self.placements.place(&uid, placement.clone());
        let moved = match &previous {
            Some(previous) => {
                previous.sha256 != placement.sha256 && (previous.candidate || candidate)
            }
            // Before the rollout every parent ran the active version.
            None => candidate,
        };
        if moved {
            let was = previous.map_or_else(|| "the active version".to_string(), |p| p.label);
            let because = match (why, rollout.as_deref()) {
                (Some(why), _) => format!("the staged rollout's new version: {why}"),
                (None, Some(r)) => match r.state.rolled_back() {
                    Some(reason) => format!(
                        "the staged rollout of {} was rolled back ({reason})",
                        r.policy.plugin.label()
                    ),
                    None => "the staged rollout no longer selects it".to_string(),
                },
                (None, None) => {
                    "the staged rollout ended (promoted, or its ConfigMap changed or was deleted)"
                        .to_string()
                }
            };
            let event = Event {
                event_type: EventType::Normal,
                reason: "PluginVersionChanged".to_string(),
                message: format!(
                    "now decided by {} (sha256 {}), {because}; was {was}",
                    placement.label,
                    placement.sha256.get(..12).unwrap_or_default()
                ),
            };
            tracing::info!(policy = %self.policy, parent = %placement.parent, version = %placement.label, candidate, "parent moved to another version");
            if let Err(error) = self.executor.record_event(parent, event).await {
                tracing::warn!(%error, "could not record the version change Event");
            }
        }
        if let Some(rollout) = &rollout
            && let Some(census) = self.placements.census_due(
                Arc::as_ptr(rollout) as usize,
                rollout.policy.plugin.content_sha256(),
            )
        {
            let candidate = rollout.policy.plugin.label();
            let active = self.store.get(&self.policy);
            if let Some(active) = active.as_ref().filter(|a| a.plugin.label() != candidate) {
                self.metrics
                    .rollout_parents(&self.policy, active.plugin.label(), census.active);
            }
            self.metrics
                .rollout_parents(&self.policy, candidate, census.candidate);
            rollout.state.set_census(census);
        }
        Ok(Version {
            loaded,
            rollout,
            candidate,
        })
    }

    /// Tallies the outcome of a reconcile that ran `version` while a rollout runs, and rolls
    /// the rollout back when the judgement says so (every parent then reconciles on the
    /// active version: the store's change triggers it).
    pub(super) fn tally(
        &self,
        parent: &DynamicObject,
        version: &Version,
        outcome: Result<(), &ReconcileError>,
        decided: Option<bool>,
    ) {
        let Some(rollout) = version
            .rollout
            .as_ref()
            .filter(|r| r.state.rolled_back().is_none())
        else {
            return;
        };
        let failed = match blame(&outcome, decided) {
            Blame::Succeeded => false,
            Blame::Failed => true,
            Blame::NotCounted => return,
        };
        self.metrics
            .rollout_decided(&self.policy, version.loaded.plugin.label(), failed);
        let verdict = rollout
            .state
            .record(&rollout.spec, version.candidate, failed);
        if let Verdict::RollBack(reason) = verdict
            && self.store.roll_back(rollout, reason.clone())
        {
            tracing::warn!(
                policy = %self.policy,
                candidate = rollout.policy.plugin.label(),
                parent = %format!("{}/{}", parent.namespace().unwrap_or_default(), parent.name_any()),
                %reason,
                "staged rollout rolled back: every parent returns to the active version"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> ReconcileError {
        ReconcileError::Act(ActError::Api {
            what: "apply".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("refused", "Invalid")
                    .with_code(code)
                    .boxed(),
            ),
        })
    }

    /// What counts against a version: each row a reconcile's outcome.
    #[test]
    fn what_counts_against_a_version() {
        let trap = ReconcileError::Decide(DecideError::Trap {
            plugin: "p@2".into(),
            doing: "d".into(),
            message: "m".into(),
        });
        let refused = ReconcileError::Decide(DecideError::Refused {
            plugin: "p@2".into(),
            doing: "d".into(),
            reason: "InvalidSpec".into(),
            message: "m".into(),
        });
        let busy = ReconcileError::Decide(DecideError::SandboxBusy {
            plugin: "p@2".into(),
            doing: "d".into(),
        });
        let action_refused = ReconcileError::Act(ActError::Refused {
            plugin: "p@2".into(),
            message: "m".into(),
        });
        let stale = ReconcileError::Act(ActError::StaleView {
            what: "w".into(),
            why: "y".into(),
        });
        let cache_full = ReconcileError::ChildCacheFull {
            policy: "p".into(),
            kind: "pods.v1".into(),
            namespace: "n".into(),
        };
        let (invalid, unavailable) = (api_error(422), api_error(503));
        // (situation, outcome, decided, blame)
        /// (situation, outcome, decided, blame)
        type Row<'a> = (&'a str, Result<(), &'a ReconcileError>, Option<bool>, Blame);
        let rows: Vec<Row> = vec![
            (
                "decided and carried out",
                Ok(()),
                Some(false),
                Blame::Succeeded,
            ),
            (
                "decided a Degraded parent",
                Ok(()),
                Some(true),
                Blame::Failed,
            ),
            (
                "nothing decided (deferred)",
                Ok(()),
                None,
                Blame::NotCounted,
            ),
            ("a trap", Err(&trap), None, Blame::Failed),
            ("a refusal of its own", Err(&refused), None, Blame::Failed),
            ("no free sandbox slot", Err(&busy), None, Blame::NotCounted),
            (
                "an action outside its grants",
                Err(&action_refused),
                Some(false),
                Blame::Failed,
            ),
            (
                "an object the API server finds invalid",
                Err(&invalid),
                Some(false),
                Blame::Failed,
            ),
            (
                "an API server in trouble",
                Err(&unavailable),
                Some(false),
                Blame::NotCounted,
            ),
            ("a stale view", Err(&stale), Some(false), Blame::NotCounted),
            (
                "a full child cache",
                Err(&cache_full),
                None,
                Blame::NotCounted,
            ),
        ];
        for (situation, outcome, decided, expected) in rows {
            assert_eq!(blame(&outcome, decided), expected, "{situation}");
        }
    }

    fn placed(parent: &str, sha: &str, candidate: bool) -> Placement {
        Placement {
            parent: parent.into(),
            sha256: sha.into(),
            label: format!("p@{sha}"),
            candidate,
        }
    }

    #[test]
    fn the_census_counts_each_side_and_is_published_when_it_changes() {
        let placements = Placements::default();
        placements.place("a", placed("ns/a", "new", true));
        placements.place("b", placed("ns/b", "old", false));
        placements.place("c", placed("ns/c", "old", false));
        let census = placements.census_due(1, "new").expect("a first census");
        assert_eq!((census.candidate, census.active), (1, 2));
        assert_eq!(census.on_candidate, vec!["ns/a".to_string()]);
        assert_eq!(placements.census_due(1, "new"), None, "nothing changed");
        assert!(placements.census_due(2, "new").is_some(), "another rollout");
        placements.place("b", placed("ns/b", "old", false));
        assert_eq!(placements.census_due(2, "new"), None, "the same placement");
        placements.forget("a");
        let census = placements.census_due(2, "new").expect("a parent left");
        assert_eq!((census.candidate, census.active), (0, 2));
        placements.retain(|uid| uid == "b");
        assert_eq!(placements.len(), 1);
    }
}
