//! The policy store: which plugins are loaded, under which grants, swapped atomically.
//!
//! Loading sources feed it ([`crate::load`]: files given on the command line, labelled
//! ConfigMaps); controllers read the current plugin on every reconcile, so a swap takes effect
//! at the next decision while in-flight ones finish on the version they started with.
//!
//! Beside the active plugins it keeps at most one *shadow* per target kind: a candidate that
//! decides on the same observations as the active plugin of that kind, whose decisions are
//! compared and never carried out ([`crate::shadow`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use crate::capability::scope::Grants;
use crate::contract::KindRef;
use crate::decide::Plugin;

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
}

/// The loaded plugins by name. Cheap to clone; every clone sees the same store.
#[derive(Clone)]
pub struct PolicyStore {
    policies: watch::Sender<BTreeMap<String, Arc<LoadedPolicy>>>,
    /// Shadows by target kind (`KindRef` display form).
    shadows: watch::Sender<BTreeMap<String, Arc<LoadedPolicy>>>,
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

    /// A receiver that sees every change to the store.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Arc<LoadedPolicy>>> {
        self.policies.subscribe()
    }
}
