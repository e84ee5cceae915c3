//! The policy store: which plugins are loaded, under which grants, swapped atomically.
//!
//! Loading sources feed it (today a file given on the command line; ConfigMaps slot in the
//! same way), controllers read the current plugin on every reconcile, so a swap takes effect
//! at the next decision while in-flight ones finish on the version they started with.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use crate::decide::contract::Capability;
use crate::decide::{DecideError, Limits, Plugin, Sandbox};

/// What the admin allows a plugin to do beyond deciding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// Ports (names or numbers) of its own pods the plugin may app-call.
    pub app_call_ports: Vec<String>,
}

impl Grants {
    /// Everything the plugin asks for (for plugins the admin loads from a local file).
    pub fn as_requested(plugin: &Plugin) -> Self {
        Self {
            app_call_ports: plugin
                .info()
                .capabilities
                .iter()
                .map(|c| match c {
                    Capability::AppCall(port) => port.clone(),
                })
                .collect(),
        }
    }
}

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
}

impl LoadedPolicy {
    /// The key the store files it under: the plugin's name.
    pub fn name(&self) -> &str {
        &self.plugin.info().name
    }
}

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read plugin file {path}: {source}; check the --policy path")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a usable plugin.
    #[error(transparent)]
    Plugin(#[from] DecideError),
}

/// The loaded plugins by name. Cheap to clone; every clone sees the same store.
#[derive(Clone)]
pub struct PolicyStore {
    policies: watch::Sender<BTreeMap<String, Arc<LoadedPolicy>>>,
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

    /// A receiver that sees every change to the store.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Arc<LoadedPolicy>>> {
        self.policies.subscribe()
    }
}

/// Loads a plugin from a file, granting what it asks for (the admin chose the file).
pub async fn load_file(
    sandbox: &Sandbox,
    path: &Path,
    limits: Limits,
) -> Result<LoadedPolicy, LoadError> {
    let bytes = tokio::fs::read(path).await.map_err(|source| LoadError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let source = path.display().to_string();
    let plugin = sandbox.load(&source, &bytes, limits).await?;
    Ok(LoadedPolicy {
        grants: Grants::as_requested(&plugin),
        plugin,
        source,
        loaded_at: SystemTime::now(),
    })
}
