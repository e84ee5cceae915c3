//! The policy store: which plugins are loaded, under which grants, swapped atomically.
//!
//! Loading sources feed it ([`crate::load`]: files given on the command line, labelled
//! ConfigMaps); controllers read the current plugin on every reconcile, so a swap takes effect
//! at the next decision while in-flight ones finish on the version they started with.
//!
//! Beside the active plugins it keeps at most one *shadow* per target kind: a candidate that
//! decides on the same observations as the active plugin of that kind, whose decisions are
//! compared and never carried out ([`crate::shadow`]).
//!
//! And at most one *rollout* per target kind: a candidate version that decides, and is acted
//! on, for the parents its rollout selects while the active plugin decides for the rest
//! ([`crate::rollout`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use crate::capability::scope::Grants;
use crate::contract::KindRef;
use crate::decide::Plugin;
use crate::rollout::{RolloutSpec, RolloutState};

/// A plugin as loaded: the compiled plugin, its grants and where it came from.
#[derive(Clone, Debug)]
pub struct LoadedPolicy {
    /// The compiled plugin.
    pub plugin: Plugin,
    /// What the admin granted it.
    pub grants: Grants,
    /// Where it came from (a path, a ConfigMap).
    pub source: String,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// Parents reconciled at the same time (`None`: the host's default).
    pub concurrency: Option<u16>,
}

impl LoadedPolicy {
    /// What is loaded, as `/plugins` and the status ConfigMap show it; `mode` is `active` or
    /// `shadow`.
    pub fn summary(&self, mode: &str) -> serde_json::Value {
        let policy = self;
        let info = policy.plugin.info();
        let limits = policy.plugin.limits();
        let since = k8s_openapi::jiff::Timestamp::try_from(policy.loaded_at)
            .map(|t| t.to_string())
            .unwrap_or_default();
        serde_json::json!({
            "name": info.name,
            "version": info.version,
            "mode": mode,
            "sha256": policy.plugin.content_sha256(),
            "target": info.target.to_string(),
            "children": info.children.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
            "source": policy.source,
            "since": since,
            "grants": {
                "appCall": policy.grants.app_call_ports,
                "exchange": policy.grants.exchange_ports,
            },
            "granted": policy.grants.describe(),
            "limits": {
                "deadlineMs": u64::try_from(limits.deadline.as_millis()).unwrap_or(u64::MAX),
                "memoryMiB": limits.memory_bytes >> 20,
                "outputKiB": limits.output_bytes >> 10,
            },
            "concurrency": policy.concurrency,
        })
    }

    /// The key the store files it under: the plugin's name.
    pub fn name(&self) -> &str {
        &self.plugin.info().name
    }

    /// The child kinds it declares, sorted (`plural.group/version`).
    pub fn child_kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self
            .plugin
            .info()
            .children
            .iter()
            .map(|k| k.to_string())
            .collect();
        kinds.sort();
        kinds
    }
}

/// A candidate version rolled out over the active plugin of its kind.
#[derive(Debug)]
pub struct LoadedRollout {
    /// The candidate.
    pub policy: Arc<LoadedPolicy>,
    /// Which parents it decides for and when it rolls back.
    pub spec: RolloutSpec,
    /// Its tally, census and rollback; kept when only the spec changes (a wider rollout of
    /// the same build keeps its figures).
    pub state: Arc<RolloutState>,
}

impl LoadedRollout {
    /// Whether the candidate can stand in for `active` parent by parent: the same plugin (its
    /// name is in the parents' finalizer and the children's label) with the same child kinds
    /// (the controller watches the active plugin's). Checked at load; checked again at each
    /// decision, for a rollout loaded before its active plugin.
    pub fn fits(&self, active: &LoadedPolicy) -> bool {
        self.policy.name() == active.name() && self.policy.child_kinds() == active.child_kinds()
    }

    /// What `/plugins` and the status ConfigMap show: the candidate's summary with a `rollout`
    /// block (the spec, the state, the parents on each side, both versions' figures).
    pub fn summary(&self, active: Option<&LoadedPolicy>) -> serde_json::Value {
        let mut summary = self.policy.summary("rollout");
        let tally = self.state.tally();
        let census = self.state.census();
        let candidate = self.policy.plugin.label();
        let over = active.map(|a| a.plugin.label().to_string());
        let state = if self.state.rolled_back().is_some() {
            "RolledBack"
        } else {
            "Running"
        };
        summary["rollout"] = serde_json::json!({
            "over": over,
            "selector": self.spec.selector,
            "percent": self.spec.percent(),
            "maxFailureRate": self.spec.max_failure_rate(),
            "minDecisions": self.spec.min_decisions(),
            "state": state,
            "rolledBack": self.state.rolled_back(),
            "parents": { "candidate": census.candidate, "active": census.active },
            "onCandidate": census.on_candidate,
            "candidate": { "version": candidate, "decisions": tally.candidate.summary() },
            "active": { "version": over, "decisions": tally.active.summary() },
        });
        summary
    }
}

/// The loaded plugins by name. Cheap to clone; every clone sees the same store.
#[derive(Clone)]
pub struct PolicyStore {
    policies: watch::Sender<BTreeMap<String, Arc<LoadedPolicy>>>,
    /// Shadows by target kind (`KindRef` display form).
    shadows: watch::Sender<BTreeMap<String, Arc<LoadedPolicy>>>,
    /// Rollouts by target kind (`KindRef` display form).
    rollouts: watch::Sender<BTreeMap<String, Arc<LoadedRollout>>>,
}

impl Default for PolicyStore {
    fn default() -> Self {
        Self::new()
    }
}

impl PolicyStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            policies: watch::Sender::new(BTreeMap::new()),
            shadows: watch::Sender::new(BTreeMap::new()),
            rollouts: watch::Sender::new(BTreeMap::new()),
        }
    }

    /// Puts `policy` in the store, replacing any policy of the same name in one step.
    pub fn insert(&self, policy: LoadedPolicy) {
        let policy = Arc::new(policy);
        self.policies.send_modify(|map| {
            map.insert(policy.name().to_string(), policy.clone());
        });
    }

    /// Removes the policy called `name`.
    pub fn remove(&self, name: &str) {
        self.policies.send_modify(|map| {
            map.remove(name);
        });
    }

    /// The current version of the policy called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<LoadedPolicy>> {
        self.policies.borrow().get(name).cloned()
    }

    /// Every loaded policy.
    pub fn list(&self) -> Vec<Arc<LoadedPolicy>> {
        self.policies.borrow().values().cloned().collect()
    }

    /// Yields each time the policy called `name` is replaced by a newly loaded version (or
    /// loaded again after a removal), so its controller can hand every parent to the new
    /// version at once instead of waiting for each parent's next change.
    pub fn replacements(&self, name: &str) -> impl futures::Stream<Item = ()> + Send + 'static {
        let mut changes = self.policies.subscribe();
        let current = changes.borrow_and_update().get(name).cloned();
        let state = (changes, current, name.to_string());
        futures::stream::unfold(state, |(mut changes, mut current, name)| async move {
            loop {
                changes.changed().await.ok()?;
                let now = changes.borrow_and_update().get(&name).cloned();
                let replaced = match (&current, &now) {
                    (Some(before), Some(after)) => !Arc::ptr_eq(before, after),
                    (None, Some(_)) => true,
                    _ => false,
                };
                current = now;
                if replaced {
                    return Some(((), (changes, current, name)));
                }
            }
        })
    }

    /// Puts `policy` in as the shadow of its target kind, replacing any shadow of that kind.
    pub fn insert_shadow(&self, policy: LoadedPolicy) {
        let policy = Arc::new(policy);
        let kind = policy.plugin.info().target.to_string();
        self.shadows.send_modify(|map| {
            map.insert(kind, policy);
        });
    }

    /// Removes the shadow of the kind `target` (`KindRef` display form), if `source` loaded it.
    pub fn remove_shadow(&self, target: &str, source: &str) {
        self.shadows.send_modify(|map| {
            if map.get(target).is_some_and(|p| p.source == source) {
                map.remove(target);
            }
        });
    }

    /// The shadow of the kind `target`, if one is loaded.
    pub fn shadow_for(&self, target: &KindRef) -> Option<Arc<LoadedPolicy>> {
        self.shadows.borrow().get(&target.to_string()).cloned()
    }

    /// Every loaded shadow.
    pub fn list_shadows(&self) -> Vec<Arc<LoadedPolicy>> {
        self.shadows.borrow().values().cloned().collect()
    }

    /// The active policy that reconciles the kind `target`, if any.
    pub fn active_for(&self, target: &KindRef) -> Option<Arc<LoadedPolicy>> {
        let target = target.to_string();
        self.policies
            .borrow()
            .values()
            .find(|p| p.plugin.info().target.to_string() == target)
            .cloned()
    }

    /// A receiver that sees every change to the shadows.
    pub fn subscribe_shadows(&self) -> watch::Receiver<BTreeMap<String, Arc<LoadedPolicy>>> {
        self.shadows.subscribe()
    }

    /// Puts `rollout` in as the rollout of its target kind, replacing any rollout of that kind.
    pub fn insert_rollout(&self, rollout: LoadedRollout) {
        let rollout = Arc::new(rollout);
        let kind = rollout.policy.plugin.info().target.to_string();
        self.rollouts.send_modify(|map| {
            map.insert(kind, rollout);
        });
    }

    /// Removes the rollout of the kind `target` (`KindRef` display form), if `source` loaded it.
    pub fn remove_rollout(&self, target: &str, source: &str) {
        self.rollouts.send_modify(|map| {
            if map.get(target).is_some_and(|r| r.policy.source == source) {
                map.remove(target);
            }
        });
    }

    /// The rollout of the kind `target`, if one is loaded (rolled back or not).
    pub fn rollout_for(&self, target: &KindRef) -> Option<Arc<LoadedRollout>> {
        self.rollouts.borrow().get(&target.to_string()).cloned()
    }

    /// Every loaded rollout.
    pub fn list_rollouts(&self) -> Vec<Arc<LoadedRollout>> {
        self.rollouts.borrow().values().cloned().collect()
    }

    /// Rolls `rollout` back for `reason`: from the next decision on, every parent runs the
    /// active plugin. `true` for the first caller only; every watcher of the rollouts hears of
    /// it (the controller reconciles every parent, the ConfigMap source marks the pack).
    pub fn roll_back(&self, rollout: &LoadedRollout, reason: String) -> bool {
        let first = rollout.state.roll_back(reason);
        if first {
            self.rollouts.send_modify(|_| {});
        }
        first
    }

    /// A receiver that sees every change to the rollouts, rollbacks included.
    pub fn subscribe_rollouts(&self) -> watch::Receiver<BTreeMap<String, Arc<LoadedRollout>>> {
        self.rollouts.subscribe()
    }

    /// Yields each time the rollout of the kind `target` is loaded, changed, rolled back or
    /// removed, so its controller can move every parent to the version it now gets at once.
    pub fn rollout_changes(
        &self,
        target: &str,
    ) -> impl futures::Stream<Item = ()> + Send + 'static {
        let mut changes = self.rollouts.subscribe();
        let seen = |map: &BTreeMap<String, Arc<LoadedRollout>>, target: &str| {
            map.get(target)
                .map(|r| (Arc::as_ptr(r) as usize, r.state.rolled_back().is_some()))
        };
        let current = seen(&changes.borrow_and_update(), target);
        let state = (changes, current, target.to_string());
        futures::stream::unfold(
            state,
            move |(mut changes, mut current, target)| async move {
                loop {
                    changes.changed().await.ok()?;
                    let now = seen(&changes.borrow_and_update(), &target);
                    let changed = now != current;
                    current = now;
                    if changed {
                        return Some(((), (changes, current, target)));
                    }
                }
            },
        )
    }

    /// A receiver that sees every change to the store.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Arc<LoadedPolicy>>> {
        self.policies.subscribe()
    }
}
