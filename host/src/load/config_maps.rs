//! The ConfigMap source: watches plugin packs (ConfigMaps labelled
//! [`PLUGIN_LABEL`](super::pack::PLUGIN_LABEL)`=true`) in one namespace and keeps the
//! [`PolicyStore`] in step with them.
//!
//! - add or change: decode, verify, compile, describe — and only then swap the new version in,
//!   in one step. A refusal leaves the previous version running.
//! - delete: the policy leaves the store, and the supervisor stops its controller.
//!
//! Each load, swap, refusal and unload is a log line, a `policy_host_plugin_loads_total`
//! count, and an Event on the ConfigMap (`kubectl describe configmap <name>` shows the history).

use std::collections::HashMap;
use std::time::SystemTime;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use super::pack::{Mode, PLUGIN_LABEL, PackDefaults, PluginPack};
use super::{LoadError, PluginLoader};
use crate::metrics::Metrics;
use crate::policy_store::{LoadedPolicy, PolicyStore};

/// Why a valid plugin from a ConfigMap was still not swapped in.
#[derive(Debug, thiserror::Error)]
pub enum RefusalError {
    /// The pack or the component was refused.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Another source already loaded a plugin of this name.
    #[error(
        "plugin `{plugin}` is already loaded from {other}; a plugin name may come from one source only: delete one of them, or rename the plugin"
    )]
    NameTaken {
        /// name@version.
        plugin: String,
        /// The other source.
        other: String,
    },
    /// Another plugin already reconciles the same kind.
    #[error(
        "plugin `{plugin}` reconciles {kind}, which `{other}` (from {other_source}) already reconciles; unload that one first"
    )]
    TargetTaken {
        /// name@version.
        plugin: String,
        /// The contested kind.
        kind: String,
        /// The plugin that has it.
        other: String,
        /// Where that one came from.
        other_source: String,
    },
    /// Shadow mode was asked for; this host does not run shadows yet.
    #[error(
        "{config_map} asks for mode `shadow`, which this host version does not run yet; set data.mode to `active` (or remove it) to load the plugin"
    )]
    ShadowUnsupported {
        /// namespace/name.
        config_map: String,
    },
}

impl RefusalError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RefusalError::Load(e) => e.reason(),
            RefusalError::NameTaken { .. } => "PluginNameTaken",
            RefusalError::TargetTaken { .. } => "PluginTargetTaken",
            RefusalError::ShadowUnsupported { .. } => "ShadowModeUnsupported",
        }
    }
}

/// What the watcher knows about one pack ConfigMap.
struct Known {
    /// The policy it loaded (if any load succeeded).
    policy: Option<String>,
    /// sha256 + settings of what was last tried, to skip re-lists and no-op updates.
    fingerprint: String,
}

/// Watches pack ConfigMaps in one namespace and feeds the store.
pub struct ConfigMapSource {
    client: Client,
    namespace: String,
    loader: PluginLoader,
    store: PolicyStore,
    metrics: Metrics,
    defaults: PackDefaults,
    recorder: Recorder,
    known: HashMap<String, Known>,
}

/// The source label of a ConfigMap in logs, metrics and the store.
fn source_of(namespace: &str, name: &str) -> String {
    format!("configmap {namespace}/{name}")
}

impl ConfigMapSource {
    /// A source for the packs in `namespace`.
    pub fn new(
        client: Client,
        namespace: String,
        loader: PluginLoader,
        store: PolicyStore,
        metrics: Metrics,
        defaults: PackDefaults,
    ) -> Self {
        let reporter = Reporter {
            controller: "policy-host".to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace,
            loader,
            store,
            metrics,
            defaults,
            known: HashMap::new(),
        }
    }

    /// Watches until `shutdown` resolves.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()> + Send) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = watcher::Config::default().labels(&format!("{PLUGIN_LABEL}=true"));
        let events = watcher(api, config).default_backoff();
        tokio::pin!(events);
        tokio::pin!(shutdown);
        tracing::info!(namespace = %self.namespace, label = %format!("{PLUGIN_LABEL}=true"), "watching plugin ConfigMaps");
        let mut listed: Option<Vec<String>> = None;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = &mut shutdown => break,
            };
            match event {
                None => break,
                Some(Err(error)) => {
                    tracing::warn!(namespace = %self.namespace, %error, "watching plugin ConfigMaps failed; retrying");
                }
                Some(Ok(watcher::Event::Init)) => listed = Some(Vec::new()),
                Some(Ok(watcher::Event::InitApply(cm))) => {
                    if let Some(listed) = listed.as_mut() {
                        listed.push(cm.name_any());
                    }
                    self.applied(&cm).await;
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    // ConfigMaps deleted while the watch was down are gone from the re-list.
                    let listed = listed.take().unwrap_or_default();
                    let gone: Vec<String> = self
                        .known
                        .keys()
                        .filter(|name| !listed.contains(name))
                        .cloned()
                        .collect();
                    for name in gone {
                        self.deleted(&name, None).await;
                    }
                }
                Some(Ok(watcher::Event::Apply(cm))) => self.applied(&cm).await,
                Some(Ok(watcher::Event::Delete(cm))) => {
                    self.deleted(&cm.name_any(), Some(&cm)).await;
                }
            }
        }
    }

    async fn applied(&mut self, cm: &ConfigMap) {
        let name = cm.name_any();
        let source = source_of(&self.namespace, &name);
        let fingerprint = fingerprint(cm);
        if self
            .known
            .get(&name)
            .is_some_and(|k| k.fingerprint == fingerprint)
        {
            return;
        }
        let previous_policy = self.known.get(&name).and_then(|k| k.policy.clone());
        let outcome = self.load(cm, &source, previous_policy.as_deref()).await;
        match outcome {
            Ok((loaded, replaced)) => {
                let plugin = loaded.plugin.clone();
                let info = plugin.info();
                let (outcome, message) = match &replaced {
                    Some(before) => (
                        "Swapped",
                        format!(
                            "swapped in {} (sha256 {}) for {}, replacing {}; the next reconcile of each parent uses it",
                            plugin.label(),
                            short(plugin.content_sha256()),
                            info.target,
                            before
                        ),
                    ),
                    None => (
                        "Loaded",
                        format!(
                            "loaded {} (sha256 {}) for {}, granted {:?}",
                            plugin.label(),
                            short(plugin.content_sha256()),
                            info.target,
                            loaded.grants.describe()
                        ),
                    ),
                };
                tracing::info!(
                    source = %source,
                    plugin = plugin.label(),
                    sha256 = plugin.content_sha256(),
                    target = %info.target,
                    grants = ?loaded.grants.describe(),
                    limits = ?plugin.limits(),
                    replaced = ?replaced,
                    "plugin {}", outcome.to_lowercase()
                );
                self.metrics.plugin_load(&source, outcome);
                let policy = loaded.name().to_string();
                // A ConfigMap that now carries a plugin of another name unloads the old one.
                if let Some(old) = previous_policy.filter(|old| *old != policy) {
                    self.store.remove(&old);
                }
                self.store.insert(loaded);
                self.record(
                    cm,
                    KubeEventType::Normal,
                    &format!("Plugin{outcome}"),
                    message,
                )
                .await;
                self.known.insert(
                    name,
                    Known {
                        policy: Some(policy),
                        fingerprint,
                    },
                );
            }
            Err(error) => {
                // What keeps running goes first: a long error is cut at the Event's 1 kB.
                let still_running = previous_policy
                    .as_deref()
                    .and_then(|p| self.store.get(p))
                    .map(|p| format!("{} keeps running", p.plugin.label()))
                    .unwrap_or_else(|| "nothing loaded from it".to_string());
                tracing::warn!(source = %source, reason = error.reason(), "plugin refused ({still_running}): {error}");
                self.metrics.plugin_load(&source, error.reason());
                self.record(
                    cm,
                    KubeEventType::Warning,
                    error.reason(),
                    format!("refused ({still_running}): {error}"),
                )
                .await;
                self.known.insert(
                    name,
                    Known {
                        policy: previous_policy,
                        fingerprint,
                    },
                );
            }
        }
    }

    /// Decodes, verifies and compiles a pack; returns the policy and the label of the version
    /// it replaces, if any.
    async fn load(
        &self,
        cm: &ConfigMap,
        source: &str,
        previous_policy: Option<&str>,
    ) -> Result<(LoadedPolicy, Option<String>), RefusalError> {
        let pack = PluginPack::from_config_map(cm, &self.defaults).map_err(LoadError::from)?;
        if pack.mode == Mode::Shadow {
            return Err(RefusalError::ShadowUnsupported {
                config_map: format!("{}/{}", self.namespace, cm.name_any()),
            });
        }
        let (plugin, cache) = self
            .loader
            .load(source, &pack.component, &pack.sha256, pack.limits)
            .await?;
        tracing::debug!(source = %source, ?cache, "plugin compiled");
        let loaded = LoadedPolicy {
            plugin,
            grants: pack.grants,
            source: source.to_string(),
            loaded_at: SystemTime::now(),
            concurrency: Some(pack.concurrency),
        };
        let name = loaded.name();
        let mut replaced = None;
        if let Some(existing) = self.store.get(name) {
            if existing.source != source {
                return Err(RefusalError::NameTaken {
                    plugin: loaded.plugin.label().to_string(),
                    other: existing.source.clone(),
                });
            }
            replaced = Some(existing.plugin.label().to_string());
        }
        let target = &loaded.plugin.info().target;
        if let Some(other) = self.store.list().into_iter().find(|p| {
            p.name() != name
                && Some(p.name()) != previous_policy
                && p.plugin.info().target.to_string() == target.to_string()
        }) {
            return Err(RefusalError::TargetTaken {
                plugin: loaded.plugin.label().to_string(),
                kind: target.to_string(),
                other: other.plugin.label().to_string(),
                other_source: other.source.clone(),
            });
        }
        Ok((loaded, replaced))
    }

    async fn deleted(&mut self, name: &str, cm: Option<&ConfigMap>) {
        let Some(known) = self.known.remove(name) else {
            return;
        };
        let source = source_of(&self.namespace, name);
        let Some(policy) = known.policy else {
            return;
        };
        let Some(loaded) = self.store.get(&policy).filter(|p| p.source == source) else {
            return;
        };
        self.store.remove(&policy);
        tracing::info!(source = %source, plugin = loaded.plugin.label(), "plugin unloaded: its ConfigMap was deleted; its controller stops");
        self.metrics.plugin_load(&source, "Unloaded");
        if let Some(cm) = cm {
            let message = format!(
                "unloaded {}: its ConfigMap was deleted; the controller for {} stops",
                loaded.plugin.label(),
                loaded.plugin.info().target
            );
            self.record(cm, KubeEventType::Normal, "PluginUnloaded", message)
                .await;
        }
    }

    async fn record(&self, cm: &ConfigMap, type_: KubeEventType, reason: &str, mut note: String) {
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = KubeEvent {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "LoadPlugin".to_string(),
            secondary: None,
        };
        let reference = cm.object_ref(&());
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(config_map = %cm.name_any(), %error, "cannot record an Event on the plugin ConfigMap");
        }
    }
}

/// What decides whether a ConfigMap needs loading again: its contents, not its metadata.
fn fingerprint(cm: &ConfigMap) -> String {
    let mut text = String::new();
    for (key, value) in cm.binary_data.iter().flatten() {
        text.push_str(key);
        text.push_str(&super::pack::sha256_hex(&value.0));
    }
    for (key, value) in cm.data.iter().flatten() {
        text.push_str(key);
        text.push('=');
        text.push_str(value);
        text.push('\n');
    }
    super::pack::sha256_hex(text.as_bytes())
}

fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}
