//! The ConfigMap source: watches plugin packs (ConfigMaps labelled
//! [`PLUGIN_LABEL`](super::pack::PLUGIN_LABEL)`=true`) in one namespace and keeps the
//! [`PolicyStore`] in step with them.
//!
//! - add or change: decode, verify, compile, describe — and only then swap the new version in,
//!   in one step. A refusal leaves the previous version running.
//! - delete: the policy leaves the store, and the supervisor stops its controller.
//! - `data.mode: shadow`: the plugin loads as the *shadow* of the active plugin of its kind
//!   ([`crate::shadow`]): it decides on every observation next to the active one and its
//!   decisions are compared, never carried out. At most one shadow per kind.
//! - promotion: changing a shadow's `data.mode` to `active` swaps it in for the active plugin
//!   of its kind in one step, even though that plugin came from another ConfigMap. The host
//!   then marks the replaced ConfigMap with the annotation [`SUPERSEDED_BY`] (naming the
//!   promoted one), and skips it while the promoted ConfigMap exists, after restarts too; delete
//!   it once satisfied, or delete the promoted one and remove the annotation to roll back.
//! - `data.mode: rollout`: the plugin loads as the *rollout* of the active plugin of its kind
//!   ([`crate::rollout`]): a new version of the same plugin that decides for the parents
//!   `data.rollout` selects. At most one per kind. Changing `data.rollout` widens or narrows it
//!   (its figures kept); `data.mode: active` promotes it as a shadow is promoted. When the
//!   controller rolls it back, the host annotates its ConfigMap [`ROLLED_BACK`] (the component's
//!   sha256) and does not load that build from it again, after restarts too.
//!
//! - a pack naming its component by digest in a registry (`data.reference`): the signature is
//!   checked first, then the component is pulled ([`super::oci`]) with the pull Secret and CA
//!   the pack names, checked against its digests and pin, and goes on as the bytes of any
//!   pack; a failed pull is a refusal like any other, and the previous version keeps running.
//!
//! Each load, swap, refusal and unload is a log line, a `policy_host_plugin_loads_total`
//! count, and an Event on the ConfigMap (`kubectl describe configmap <name>` shows the history).
//! A deleted ConfigMap's counts go with it, so the series follow the ConfigMaps that exist.

use std::collections::HashMap;
use std::time::SystemTime;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use super::oci::{self, OciError, RegistryAccess};
use super::pack::{CA_KEY, CaSource, Mode, PLUGIN_LABEL, PackDefaults, PluginPack, RegistryPull};
use super::trust::{TrustError, TrustPolicy};
use super::{LoadError, PluginLoader};
use crate::decide::Plugin;
use crate::decide::sandbox::{INSTANCE_SLOTS, SHADOW_RUNS_IN_FLIGHT};
use crate::metrics::Metrics;
use crate::policy_store::{LoadedPolicy, LoadedRollout, PolicyStore};
use crate::rollout::{RolloutSpec, RolloutState};
use std::sync::Arc;

/// Why a valid plugin from a ConfigMap was still not swapped in.
#[derive(Debug, thiserror::Error)]
pub enum RefusalError {
    /// The pack or the component was refused.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The pack is not signed by a key the host trusts.
    #[error(transparent)]
    Trust(#[from] TrustError),
    /// The component the pack names could not be pulled.
    #[error("ConfigMap {config_map}: {source}")]
    Pull {
        /// namespace/name.
        config_map: String,
        /// Why.
        #[source]
        source: OciError,
    },
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
    /// The loaded plugins could run more instances at once than the host holds.
    #[error(
        "plugin `{plugin}` (concurrency {concurrency}) would let the loaded plugins run {demand} instances at once, and this host holds {slots}; lower data.limits.concurrency of this or another plugin"
    )]
    PoolFull {
        /// name@version.
        plugin: String,
        /// Its concurrency.
        concurrency: u16,
        /// Instance slots all loaded plugins (with this one) may take at once.
        demand: u32,
        /// What the host holds.
        slots: u32,
    },
    /// Another ConfigMap already loaded a shadow for the same kind.
    #[error(
        "plugin `{plugin}` would shadow {kind}, which `{other}` (from {other_source}) already shadows; one shadow per kind: delete that one first, or promote it"
    )]
    ShadowTaken {
        /// name@version.
        plugin: String,
        /// The contested kind.
        kind: String,
        /// The shadow that has it.
        other: String,
        /// Where that one came from.
        other_source: String,
    },
    /// Another ConfigMap already rolls out a version for the same kind.
    #[error(
        "plugin `{plugin}` would roll out over {kind}, which `{other}` (from {other_source}) already rolls out; one rollout per kind: delete that one first, or promote it"
    )]
    RolloutTaken {
        /// name@version.
        plugin: String,
        /// The contested kind.
        kind: String,
        /// The rollout that has it.
        other: String,
        /// Where that one came from.
        other_source: String,
    },
    /// The candidate cannot stand in for the active plugin parent by parent.
    #[error("plugin `{plugin}` cannot be rolled out over `{active}`: {why}")]
    RolloutMismatch {
        /// name@version of the candidate.
        plugin: String,
        /// name@version of the active plugin.
        active: String,
        /// What differs and what to do.
        why: String,
    },
}

/// The annotation the host puts on a rollout's ConfigMap when it rolls the rollout back: the
/// sha256 of the component rolled back. That build is not loaded from the ConfigMap again.
pub const ROLLED_BACK: &str = "policy-host.io/rolled-back";

/// The annotation the host puts on a plugin ConfigMap whose plugin a promoted shadow replaced:
/// the name of the promoted ConfigMap. While that one exists, this one is not loaded.
pub const SUPERSEDED_BY: &str = "policy-host.io/superseded-by";

impl RefusalError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RefusalError::Load(e) => e.reason(),
            RefusalError::Trust(e) => e.reason(),
            RefusalError::Pull { source, .. } => source.reason(),
            RefusalError::NameTaken { .. } => "PluginNameTaken",
            RefusalError::TargetTaken { .. } => "PluginTargetTaken",
            RefusalError::ShadowTaken { .. } => "PluginShadowTaken",
            RefusalError::PoolFull { .. } => "PluginPoolFull",
            RefusalError::RolloutTaken { .. } => "PluginRolloutTaken",
            RefusalError::RolloutMismatch { .. } => "PluginRolloutMismatch",
        }
    }
}

/// What a plugin being checked against the pool will be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Candidate<'a> {
    /// The active plugin of its kind, replacing the policy of this name if any.
    Active {
        /// The policy it replaces.
        replacing: Option<&'a str>,
    },
    /// The shadow of its kind, replacing the shadow there.
    Shadow,
    /// The rollout of its kind, replacing the rollout there.
    Rollout,
}

/// A load that passed every check, ready to go into the store.
struct Swap {
    loaded: LoadedPolicy,
    /// `Loaded`, `Swapped`, `Promoted` or `ShadowLoaded`.
    outcome: &'static str,
    /// For the Event and the log.
    message: String,
    /// What a promotion replaces.
    replaced_source: Option<Replaced>,
    /// For a rollout: its settings and state (kept from the rollout it changes).
    rollout: Option<(RolloutSpec, Arc<RolloutState>)>,
}

/// The active plugin a promotion replaces.
struct Replaced {
    /// Its ConfigMap's name (empty when it came from a file).
    config_map: String,
    /// Its policy name.
    policy: String,
}

/// What the watcher knows about one pack ConfigMap.
struct Known {
    /// The policy it loaded (if any load succeeded).
    policy: Option<String>,
    /// The kind it shadows, when it loaded a shadow.
    shadowing: Option<String>,
    /// The kind it rolls out over, when it loaded a rollout.
    rolling_out: Option<String>,
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
    /// Whose signatures a pack needs (none: every pack loads).
    trust: TrustPolicy,
    /// The largest component pulled from a registry.
    max_pull_bytes: u64,
    recorder: Recorder,
    known: HashMap<String, Known>,
    /// Rollbacks already written on their ConfigMap: (source, component sha256).
    marked_rolled_back: std::collections::HashSet<(String, String)>,
    /// Told once the first list is loaded.
    first_listed: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Instance slots the plugins may take at once: for each, its concurrency times the slots one
/// instance takes, plus the shadow runs its controller may start (each of the shadow's cost).
fn instances_at_once(policies: impl Iterator<Item = (u16, u32, u32)>) -> u32 {
    policies
        .map(|(concurrency, cost, shadow_cost)| {
            u32::from(concurrency).saturating_mul(cost).saturating_add(
                u32::try_from(SHADOW_RUNS_IN_FLIGHT)
                    .unwrap_or(u32::MAX)
                    .saturating_mul(shadow_cost),
            )
        })
        .fold(0u32, u32::saturating_add)
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
            trust: TrustPolicy::default(),
            max_pull_bytes: oci::DEFAULT_MAX_PULL_BYTES,
            known: HashMap::new(),
            marked_rolled_back: Default::default(),
            first_listed: None,
        }
    }

    /// Loads only packs signed by one of `trust`'s keys.
    pub fn with_trust(mut self, trust: TrustPolicy) -> Self {
        self.trust = trust;
        self
    }

    /// Pulls components of at most `max_bytes` from registries.
    pub fn with_pull_limit(mut self, max_bytes: u64) -> Self {
        self.max_pull_bytes = max_bytes;
        self
    }

    /// Sends on `listed` once the first list of plugin ConfigMaps is loaded (readiness).
    pub fn on_first_list(mut self, listed: tokio::sync::oneshot::Sender<()>) -> Self {
        self.first_listed = Some(listed);
        self
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
        let mut rollouts = self.store.subscribe_rollouts();
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                changed = rollouts.changed() => {
                    if changed.is_ok() {
                        self.mark_rolled_back().await;
                    }
                    continue;
                }
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
                    if let Some(listed) = self.first_listed.take() {
                        let _ = listed.send(());
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
        let previous = self.known.remove(&name);
        let previous_policy = previous.as_ref().and_then(|k| k.policy.clone());
        let previous_shadow = previous.as_ref().and_then(|k| k.shadowing.clone());
        let previous_rollout = previous.as_ref().and_then(|k| k.rolling_out.clone());
        if let Some(promoted) = self.superseded_by(cm).await {
            self.superseded(cm, &source, &promoted, previous_policy.as_deref())
                .await;
            self.known.insert(
                name,
                Known {
                    policy: None,
                    shadowing: None,
                    rolling_out: None,
                    fingerprint,
                },
            );
            return;
        }
        let pack = PluginPack::from_config_map(cm, &self.defaults)
            .map_err(|e| RefusalError::Load(LoadError::from(e)))
            .and_then(|pack| {
                // Trust before pulling or compiling: an untrusted reference is not even
                // pulled, an untrusted component not compiled.
                self.trust.verify(cm, &pack.sha256)?;
                Ok(pack)
            });
        let pack = match pack {
            Ok(mut pack) if pack.pull.is_some() => self.pull(cm, &mut pack).await.map(|()| pack),
            other => other,
        };
        if let Ok(pack) = &pack
            && pack.mode == Mode::Rollout
            && cm.annotations().get(ROLLED_BACK) == Some(&pack.sha256)
        {
            let rolling_out = self
                .rolled_back_earlier(cm, &source, &pack.sha256, previous_rollout)
                .await;
            self.known.insert(
                name,
                Known {
                    policy: None,
                    shadowing: None,
                    rolling_out,
                    fingerprint,
                },
            );
            return;
        }
        let outcome = match pack {
            Err(error) => Err(error),
            Ok(pack) if pack.mode == Mode::Shadow => {
                self.load_shadow(cm, &source, pack, previous_policy.as_deref())
                    .await
            }
            Ok(pack) if pack.mode == Mode::Rollout => self.load_rollout(cm, &source, pack).await,
            Ok(pack) => {
                // A shadow or a rollout of this ConfigMap turned active: a promotion.
                let promoting = previous_shadow
                    .as_deref()
                    .map(|kind| (kind, "shadow"))
                    .or(previous_rollout.as_deref().map(|kind| (kind, "rollout")));
                self.load(&source, pack, previous_policy.as_deref(), promoting)
                    .await
            }
        };
        let loaded = match outcome {
            Ok(loaded) => loaded,
            Err(error) => {
                // What keeps running goes first: a long error is cut at the Event's 1 kB.
                let still_running = previous_policy
                    .as_deref()
                    .and_then(|p| self.store.get(p))
                    .or_else(|| {
                        let kind = previous_shadow.as_deref()?;
                        self.store
                            .list_shadows()
                            .into_iter()
                            .find(|s| s.plugin.info().target.to_string() == kind)
                    })
                    .or_else(|| {
                        let kind = previous_rollout.as_deref()?;
                        self.store
                            .list_rollouts()
                            .into_iter()
                            .find(|r| r.policy.plugin.info().target.to_string() == kind)
                            .map(|r| r.policy.clone())
                    })
                    .filter(|p| p.source == source)
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
                        shadowing: previous_shadow,
                        rolling_out: previous_rollout,
                        fingerprint,
                    },
                );
                return;
            }
        };
        let Swap {
            loaded,
            outcome,
            message,
            replaced_source,
            rollout,
        } = loaded;
        let plugin = loaded.plugin.clone();
        let info = plugin.info();
        tracing::info!(
            source = %source,
            plugin = plugin.label(),
            sha256 = plugin.content_sha256(),
            target = %info.target,
            grants = ?loaded.grants.describe(),
            limits = ?plugin.limits(),
            "plugin {}: {message}", outcome.to_lowercase()
        );
        self.metrics.plugin_load(&source, outcome);
        let target = info.target.to_string();
        let policy_name = loaded.name().to_string();
        let rolls_out = rollout.is_some();
        let known = if let Some((spec, state)) = rollout {
            // A ConfigMap that turns from active or shadow to rollout unloads what it was.
            if let Some(old) = previous_policy {
                self.store.remove(&old);
            }
            if let Some(kind) = previous_shadow {
                self.store.remove_shadow(&kind, &source);
            }
            // A fresh rollout of a build rolled back before (its annotation removed to try
            // again) is marked again if it rolls back again.
            self.marked_rolled_back
                .remove(&(source.clone(), plugin.content_sha256().to_string()));
            self.store.insert_rollout(LoadedRollout {
                policy: Arc::new(loaded),
                spec,
                state,
            });
            Known {
                policy: None,
                shadowing: None,
                rolling_out: Some(target.clone()),
                fingerprint,
            }
        } else if outcome == "ShadowLoaded" {
            // A ConfigMap that turns from active to shadow unloads its active plugin.
            if let Some(old) = previous_policy {
                self.store.remove(&old);
            }
            self.store.insert_shadow(loaded);
            Known {
                policy: None,
                shadowing: Some(target.clone()),
                rolling_out: None,
                fingerprint,
            }
        } else {
            let policy = loaded.name().to_string();
            // A ConfigMap that now carries a plugin of another name unloads the old one.
            if let Some(old) = previous_policy.filter(|old| *old != policy) {
                self.store.remove(&old);
            }
            if let Some(replaced) = replaced_source.as_ref() {
                // A promotion: the replaced plugin's own name leaves the store in the same
                // breath as the promoted one enters (one step when the names are equal).
                if replaced.policy != policy {
                    self.store.remove(&replaced.policy);
                }
            }
            self.store.insert(loaded);
            if let Some(kind) = previous_shadow {
                self.store.remove_shadow(&kind, &source);
            }
            Known {
                policy: Some(policy),
                shadowing: None,
                rolling_out: None,
                fingerprint,
            }
        };
        // A ConfigMap that no longer carries a rollout of its kind unloads it, after what it
        // carries now is in: a promoted rollout's parents never pass through the old version.
        if let Some(kind) = previous_rollout.filter(|kind| !rolls_out || *kind != target) {
            self.store.remove_rollout(&kind, &source);
            self.metrics.rollout_ended(&policy_name);
        }
        self.record(
            cm,
            KubeEventType::Normal,
            &format!("Plugin{outcome}"),
            message,
        )
        .await;
        self.known.insert(name.clone(), known);
        if let Some(replaced) = replaced_source.filter(|r| !r.config_map.is_empty()) {
            self.mark_superseded(&replaced.config_map, &name, plugin.label())
                .await;
        }
    }

    /// The name of the promoted ConfigMap that supersedes `cm`, if `cm` carries the
    /// annotation and that ConfigMap still exists as an active pack.
    async fn superseded_by(&self, cm: &ConfigMap) -> Option<String> {
        let promoted = cm.annotations().get(SUPERSEDED_BY)?.clone();
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        match api.get_opt(&promoted).await {
            Ok(Some(other)) => {
                let active = other
                    .labels()
                    .get(PLUGIN_LABEL)
                    .is_some_and(|v| v == "true")
                    && other
                        .data
                        .as_ref()
                        .and_then(|d| d.get(super::pack::MODE_KEY))
                        .is_none_or(|mode| mode.trim() == "active");
                active.then_some(promoted)
            }
            Ok(None) => None,
            Err(error) => {
                // Unknown: loading both could fight over the kind, so stay out of the way.
                tracing::warn!(config_map = %cm.name_any(), %promoted, %error, "cannot check the ConfigMap that superseded this one; not loading it");
                Some(promoted)
            }
        }
    }

    async fn superseded(
        &mut self,
        cm: &ConfigMap,
        source: &str,
        promoted: &str,
        previous_policy: Option<&str>,
    ) {
        if let Some(policy) = previous_policy
            && self.store.get(policy).is_some_and(|p| p.source == source)
        {
            self.store.remove(policy);
        }
        tracing::info!(source = %source, promoted, "plugin not loaded: superseded by a promoted shadow");
        self.metrics.plugin_load(source, "Superseded");
        let message = format!(
            "not loaded: the plugin of ConfigMap {promoted} (a promoted shadow) replaced this one; delete this ConfigMap, or to roll back delete {promoted} and remove the annotation {SUPERSEDED_BY}"
        );
        self.record(cm, KubeEventType::Normal, "PluginSuperseded", message)
            .await;
    }

    /// Annotates the ConfigMap whose plugin a promotion replaced, so it stays unloaded after a
    /// restart, and says so in an Event on it.
    async fn mark_superseded(&mut self, config_map: &str, promoted: &str, plugin: &str) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let patch =
            serde_json::json!({ "metadata": { "annotations": { SUPERSEDED_BY: promoted } } });
        match api
            .patch(config_map, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(cm) => {
                // The annotation changes the fingerprint: remember it as seen, loading nothing.
                self.known.insert(
                    config_map.to_string(),
                    Known {
                        policy: None,
                        shadowing: None,
                        rolling_out: None,
                        fingerprint: fingerprint(&cm),
                    },
                );
                let message = format!(
                    "replaced by {plugin}, promoted from shadow in ConfigMap {promoted}; this ConfigMap is no longer loaded: delete it, or to roll back delete {promoted} and remove the annotation {SUPERSEDED_BY}"
                );
                self.record(&cm, KubeEventType::Normal, "PluginSuperseded", message)
                    .await;
            }
            Err(error) => {
                tracing::warn!(config_map, promoted, error = %crate::api_error::api_error_text(&error), "cannot annotate the superseded plugin ConfigMap; after a host restart both may claim the kind: delete it");
                if let Some(known) = self.known.get_mut(config_map) {
                    known.policy = None;
                }
            }
        }
    }

    /// Refuses `loaded` when, beside the other loaded plugins, the plugins could run more
    /// instances at once than the host holds: the pool is sized for the sum of what loaded
    /// plugins may run (review #7c), so no plugin starves another. An active `loaded` takes the
    /// place of the policy it replaces (`Candidate::Active`); a shadow takes the place of its
    /// kind's shadow and runs beside that kind's active plugin (review L2: shadows were loaded
    /// without this check, and the active plugins' decisions then got `SandboxBusy`).
    fn check_pool(
        &self,
        loaded: &LoadedPolicy,
        candidate: Candidate<'_>,
    ) -> Result<(), RefusalError> {
        let target_of = |policy: &LoadedPolicy| policy.plugin.info().target.to_string();
        let mut shadows: Vec<(String, u32)> = self
            .store
            .list_shadows()
            .iter()
            .map(|s| (target_of(s), s.plugin.slot_cost()))
            .collect();
        if candidate == Candidate::Shadow {
            shadows.retain(|(target, _)| *target != target_of(loaded));
            shadows.push((target_of(loaded), loaded.plugin.slot_cost()));
        }
        // A rollout's decisions come out of its kind's controller, any of them on either
        // version: each of them may take the dearer version's slots.
        let mut rollouts: Vec<(String, u32)> = self
            .store
            .list_rollouts()
            .iter()
            .map(|r| (target_of(&r.policy), r.policy.plugin.slot_cost()))
            .collect();
        if candidate == Candidate::Rollout {
            rollouts.retain(|(target, _)| *target != target_of(loaded));
            rollouts.push((target_of(loaded), loaded.plugin.slot_cost()));
        }
        let at_once = |policy: &LoadedPolicy| {
            let concurrency = policy.concurrency.unwrap_or(self.defaults.concurrency);
            let shadow = shadows
                .iter()
                .find(|(target, _)| *target == target_of(policy))
                .map_or(0, |(_, cost)| *cost);
            let rollout = rollouts
                .iter()
                .find(|(target, _)| *target == target_of(policy))
                .map_or(0, |(_, cost)| *cost);
            (concurrency, policy.plugin.slot_cost().max(rollout), shadow)
        };
        let demand = match candidate {
            Candidate::Active { replacing } => {
                let others = self
                    .store
                    .list()
                    .into_iter()
                    .filter(|p| p.name() != loaded.name() && Some(p.name()) != replacing)
                    .map(|p| at_once(&p))
                    .collect::<Vec<_>>();
                instances_at_once(others.into_iter().chain([at_once(loaded)]))
            }
            Candidate::Shadow | Candidate::Rollout => {
                instances_at_once(self.store.list().iter().map(|p| at_once(p)))
            }
        };
        if demand > INSTANCE_SLOTS {
            return Err(RefusalError::PoolFull {
                plugin: loaded.plugin.label().to_string(),
                concurrency: loaded.concurrency.unwrap_or(self.defaults.concurrency),
                demand,
                slots: INSTANCE_SLOTS,
            });
        }
        Ok(())
    }

    /// Compiles an active pack and checks it may take its name and kind: the swap to carry
    /// out. A pack that was this ConfigMap's shadow or rollout (`promoting`: its kind, and
    /// which it was) is a promotion: it takes the kind over from whichever ConfigMap had it.
    async fn load(
        &self,
        source: &str,
        pack: PluginPack,
        previous_policy: Option<&str>,
        promoting: Option<(&str, &str)>,
    ) -> Result<Swap, RefusalError> {
        let plugin = self.compile(source, &pack).await?;
        let loaded = LoadedPolicy {
            plugin,
            grants: pack.grants,
            source: source.to_string(),
            loaded_at: SystemTime::now(),
            concurrency: Some(pack.concurrency),
        };
        let name = loaded.name();
        let target = &loaded.plugin.info().target;
        let label = loaded.plugin.label().to_string();
        let grants = loaded.grants.describe();
        let sha = short(loaded.plugin.content_sha256()).to_string();
        let promoted_from = promoting
            .filter(|(kind, _)| *kind == target.to_string())
            .map(|(_, from)| from);
        if let Some(from) = promoted_from
            && let Some(active) = self.store.active_for(target)
        {
            if active.source == source {
                // Already this ConfigMap's own active plugin: an ordinary swap.
            } else {
                let message = format!(
                    "promoted {label} (sha256 {sha}) from {from} to active for {target}, replacing {} from {}; the next reconcile of each parent uses it",
                    active.plugin.label(),
                    active.source
                );
                // A plugin from a local file has no ConfigMap to mark: it just leaves.
                let config_map = active
                    .source
                    .strip_prefix(&format!("configmap {}/", self.namespace))
                    .unwrap_or_default()
                    .to_string();
                return Ok(Swap {
                    loaded,
                    outcome: "Promoted",
                    message,
                    replaced_source: Some(Replaced {
                        config_map,
                        policy: active.name().to_string(),
                    }),
                    rollout: None,
                });
            }
        }
        let mut replaced = None;
        if let Some(existing) = self.store.get(name) {
            if existing.source != source {
                return Err(RefusalError::NameTaken {
                    plugin: label,
                    other: existing.source.clone(),
                });
            }
            replaced = Some(existing.plugin.label().to_string());
        }
        if let Some(other) = self.store.list().into_iter().find(|p| {
            p.name() != name
                && Some(p.name()) != previous_policy
                && p.plugin.info().target.to_string() == target.to_string()
        }) {
            return Err(RefusalError::TargetTaken {
                plugin: label,
                kind: target.to_string(),
                other: other.plugin.label().to_string(),
                other_source: other.source.clone(),
            });
        }
        self.check_pool(
            &loaded,
            Candidate::Active {
                replacing: previous_policy,
            },
        )?;
        let (outcome, message) = match replaced {
            Some(before) => (
                "Swapped",
                format!(
                    "swapped in {label} (sha256 {sha}) for {target}, replacing {before}; the next reconcile of each parent uses it"
                ),
            ),
            None => (
                "Loaded",
                format!("loaded {label} (sha256 {sha}) for {target}, granted {grants:?}"),
            ),
        };
        Ok(Swap {
            loaded,
            outcome,
            message,
            replaced_source: None,
            rollout: None,
        })
    }

    /// Compiles a shadow pack and checks its kind has no other shadow.
    async fn load_shadow(
        &self,
        cm: &ConfigMap,
        source: &str,
        pack: PluginPack,
        previous_policy: Option<&str>,
    ) -> Result<Swap, RefusalError> {
        let plugin = self.compile(source, &pack).await?;
        let target = plugin.info().target.clone();
        let label = plugin.label().to_string();
        if let Some(other) = self.store.shadow_for(&target)
            && other.source != source
        {
            return Err(RefusalError::ShadowTaken {
                plugin: label,
                kind: target.to_string(),
                other: other.plugin.label().to_string(),
                other_source: other.source.clone(),
            });
        }
        let active = self
            .store
            .active_for(&target)
            .filter(|a| Some(a.name()) != previous_policy || a.source != source);
        let shadowing = match &active {
            Some(active) => format!(
                "the active {} (from {})",
                active.plugin.label(),
                active.source
            ),
            None => "no active plugin yet (it starts comparing once one loads)".to_string(),
        };
        let message = format!(
            "loaded {label} (sha256 {}) as a shadow for {target}, next to {shadowing}: it decides on every observation, its decisions are compared and never applied; promote it by setting data.mode to active in {}",
            short(plugin.content_sha256()),
            cm.name_any()
        );
        let loaded = LoadedPolicy {
            plugin,
            grants: pack.grants,
            source: source.to_string(),
            loaded_at: SystemTime::now(),
            concurrency: Some(pack.concurrency),
        };
        self.check_pool(&loaded, Candidate::Shadow)?;
        Ok(Swap {
            loaded,
            outcome: "ShadowLoaded",
            message,
            replaced_source: None,
            rollout: None,
        })
    }

    /// Compiles a rollout pack and checks it can stand in for its kind's active plugin parent
    /// by parent: the same plugin (name: finalizer and child labels) with the same child kinds
    /// (what the controller watches), from another ConfigMap, and no other rollout of the kind.
    async fn load_rollout(
        &self,
        cm: &ConfigMap,
        source: &str,
        pack: PluginPack,
    ) -> Result<Swap, RefusalError> {
        let spec = pack.rollout.clone().unwrap_or_default();
        let plugin = self.compile(source, &pack).await?;
        let target = plugin.info().target.clone();
        let label = plugin.label().to_string();
        let existing = self.store.rollout_for(&target);
        if let Some(other) = existing.as_ref().filter(|r| r.policy.source != source) {
            return Err(RefusalError::RolloutTaken {
                plugin: label,
                kind: target.to_string(),
                other: other.policy.plugin.label().to_string(),
                other_source: other.policy.source.clone(),
            });
        }
        let active = self.store.active_for(&target);
        if let Some(active) = &active {
            let mismatch = |why: String| RefusalError::RolloutMismatch {
                plugin: label.clone(),
                active: active.plugin.label().to_string(),
                why,
            };
            let (ours, theirs) = (plugin.info(), active.plugin.info());
            if active.source == source {
                return Err(mismatch(format!(
                    "this ConfigMap carries the active plugin of {target}; a rollout needs a ConfigMap of its own: pack the new version under another name (`policy-host pack --name {}-next --rollout ...`)",
                    cm.name_any()
                )));
            }
            if ours.name != theirs.name {
                return Err(mismatch(format!(
                    "it calls itself `{}` and the active plugin `{}`; a rollout is a new version of the same plugin (the name is in its parents' finalizer and its children's labels): load another plugin as active, or rename it",
                    ours.name, theirs.name
                )));
            }
        }
        let loaded = LoadedPolicy {
            plugin,
            grants: pack.grants,
            source: source.to_string(),
            loaded_at: SystemTime::now(),
            concurrency: Some(pack.concurrency),
        };
        if let Some(active) = &active
            && loaded.child_kinds() != active.child_kinds()
        {
            return Err(RefusalError::RolloutMismatch {
                plugin: label,
                active: active.plugin.label().to_string(),
                why: format!(
                    "it declares the child kinds {:?} and the active plugin {:?}; the controller watches the active plugin's kinds only, so parents on either version would miss children: swap it in whole (data.mode: active), after trying it as a shadow",
                    loaded.child_kinds(),
                    active.child_kinds()
                ),
            });
        }
        let plugin = &loaded.plugin;
        let sha = short(plugin.content_sha256()).to_string();
        // The same build with new settings (a wider rollout) keeps its figures; a new build,
        // or one rolled back, starts afresh.
        let state = existing
            .as_ref()
            .filter(|r| {
                r.policy.plugin.content_sha256() == plugin.content_sha256()
                    && r.state.rolled_back().is_none()
            })
            .map(|r| r.state.clone());
        let outcome = if state.is_some() {
            "RolloutChanged"
        } else {
            "RolloutLoaded"
        };
        let over = match &active {
            Some(active) => format!(
                "over the active {} (from {})",
                active.plugin.label(),
                active.source
            ),
            None => "with no active plugin yet (it decides once one loads)".to_string(),
        };
        let message = format!(
            "rolling out {label} (sha256 {sha}) for {target} {over}: it decides for {}; the active version for the rest. Widen it by changing data.rollout, promote it with data.mode: active (data.rollout removed), or delete ConfigMap {} to stop it",
            spec.describe(),
            cm.name_any()
        );
        self.check_pool(&loaded, Candidate::Rollout)?;
        Ok(Swap {
            loaded,
            outcome,
            message,
            replaced_source: None,
            rollout: Some((spec, state.unwrap_or_default())),
        })
    }

    /// A rollout pack whose build the host rolled back earlier ([`ROLLED_BACK`]): not loaded
    /// again. The rollback this host made stays in the store (its status says so); otherwise
    /// (after a restart) the ConfigMap gets an Event saying how to try again. Returns the kind
    /// of the rollout kept in the store.
    async fn rolled_back_earlier(
        &mut self,
        cm: &ConfigMap,
        source: &str,
        sha256: &str,
        previous_rollout: Option<String>,
    ) -> Option<String> {
        let kept = self.store.list_rollouts().into_iter().find(|r| {
            r.policy.source == source
                && r.policy.plugin.content_sha256() == sha256
                && r.state.rolled_back().is_some()
        });
        if let Some(kept) = kept {
            return Some(kept.policy.plugin.info().target.to_string());
        }
        if let Some(kind) = previous_rollout {
            self.store.remove_rollout(&kind, source);
        }
        self.metrics.plugin_load(source, "RolledBack");
        let message = format!(
            "not loaded: this build (sha256 {}) was rolled back earlier (annotation {ROLLED_BACK}; the Events before say why); apply another build, or remove the annotation to roll it out again",
            short(sha256)
        );
        self.record(cm, KubeEventType::Normal, "PluginRolledBack", message)
            .await;
        None
    }

    /// Writes every rollback the controllers made onto the rollout's ConfigMap: the annotation
    /// [`ROLLED_BACK`], so no host loads that build from it again, and a Warning Event with
    /// both versions' figures.
    async fn mark_rolled_back(&mut self) {
        let prefix = source_of(&self.namespace, "");
        let rolled_back: Vec<Arc<LoadedRollout>> = self
            .store
            .list_rollouts()
            .into_iter()
            .filter(|r| r.state.rolled_back().is_some() && r.policy.source.starts_with(&prefix))
            .collect();
        for rollout in rolled_back {
            let source = rollout.policy.source.clone();
            let sha = rollout.policy.plugin.content_sha256().to_string();
            if !self
                .marked_rolled_back
                .insert((source.clone(), sha.clone()))
            {
                continue;
            }
            let name = source.trim_start_matches(&prefix).to_string();
            let reason = rollout.state.rolled_back().unwrap_or_default();
            tracing::warn!(source = %source, plugin = rollout.policy.plugin.label(), %reason, "rollout rolled back");
            self.metrics.plugin_load(&source, "RolledBack");
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
            let patch = serde_json::json!({ "metadata": { "annotations": { ROLLED_BACK: sha } } });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(cm) => {
                    let message = format!(
                        "rolled back {} (sha256 {}): {reason}; every parent is back on the active version. This build is not loaded from this ConfigMap again (annotation {ROLLED_BACK}): apply a fixed build, or remove the annotation to roll it out again",
                        rollout.policy.plugin.label(),
                        short(&sha)
                    );
                    self.record(&cm, KubeEventType::Warning, "PluginRolledBack", message)
                        .await;
                }
                Err(error) => {
                    tracing::warn!(config_map = %name, error = %crate::api_error::api_error_text(&error), "cannot annotate the rolled-back rollout's ConfigMap; after a host restart it would roll out again: delete it");
                }
            }
        }
    }

    /// Pulls the component `pack` names into it: credentials and CA read from the objects the
    /// pack names, then [`oci::pull`] and the pin check.
    async fn pull(&self, cm: &ConfigMap, pack: &mut PluginPack) -> Result<(), RefusalError> {
        let config_map = format!("{}/{}", self.namespace, cm.name_any());
        let Some(pull) = pack.pull.clone() else {
            return Ok(());
        };
        let refused = |source: OciError| RefusalError::Pull {
            config_map: config_map.clone(),
            source,
        };
        let (access, ca_source) = self.registry_access(&pull).await.map_err(refused)?;
        let started = std::time::Instant::now();
        let pulled = oci::pull(&pull.reference, &access, &ca_source, self.max_pull_bytes)
            .await
            .map_err(refused)?;
        tracing::info!(
            config_map = %config_map,
            reference = %pull.reference,
            bytes = pulled.bytes.len(),
            sha256 = %pulled.sha256,
            pull_ms = started.elapsed().as_millis(),
            "plugin pulled"
        );
        pack.take_pulled(&config_map, pulled)
            .map_err(|e| RefusalError::Load(e.into()))
    }

    /// The credentials and CA a pull uses, read from the Secret and the object the pack names
    /// in the plugin namespace, and the CA's source for messages.
    async fn registry_access(
        &self,
        pull: &RegistryPull,
    ) -> Result<(RegistryAccess, String), OciError> {
        let mut access = RegistryAccess::default();
        if let Some(name) = &pull.pull_secret {
            let secret_name = format!("{}/{name}", self.namespace);
            let bad = |problem: String| OciError::BadPullSecret {
                secret: secret_name.clone(),
                problem,
            };
            let secret: Secret = self.read_named(name).await.map_err(&bad)?;
            let json = secret
                .data
                .as_ref()
                .and_then(|d| d.get(".dockerconfigjson"))
                .ok_or_else(|| bad("it has no key .dockerconfigjson".to_owned()))?;
            access.credentials = Some(
                oci::credentials_from_docker_config(&json.0, &pull.reference.registry)
                    .map_err(&bad)?
                    .ok_or_else(|| {
                        bad(format!(
                            "it holds no credentials for {}",
                            pull.reference.registry
                        ))
                    })?,
            );
        }
        let Some(ca) = &pull.registry_ca else {
            return Ok((access, "the system's roots".to_owned()));
        };
        let ca_source = format!("{ca} in namespace {}", self.namespace);
        let bad = |problem: String| OciError::BadRegistryCa {
            source_name: ca_source.clone(),
            problem,
        };
        let pem = match ca {
            CaSource::Secret(name) => self
                .read_named::<Secret>(name)
                .await
                .map_err(&bad)?
                .data
                .and_then(|mut d| d.remove(CA_KEY))
                .map(|b| b.0),
            CaSource::ConfigMap(name) => self
                .read_named::<ConfigMap>(name)
                .await
                .map_err(&bad)?
                .data
                .and_then(|mut d| d.remove(CA_KEY))
                .map(String::into_bytes),
        };
        access.ca_pem = Some(pem.ok_or_else(|| bad(format!("it has no key {CA_KEY}")))?);
        Ok((access, ca_source))
    }

    /// Object `name` of the plugin namespace, or why it cannot be had, worded as the problem
    /// an Event names: "it does not exist", "cannot read it (…)".
    async fn read_named<K>(&self, name: &str) -> Result<K, String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("cannot read it ({})", crate::api_error::api_error_text(&e)))?
            .ok_or_else(|| "it does not exist".to_owned())
    }

    async fn compile(&self, source: &str, pack: &PluginPack) -> Result<Plugin, RefusalError> {
        let (plugin, cache) = self
            .loader
            .load(source, &pack.component, &pack.sha256, pack.limits.clone())
            .await?;
        tracing::debug!(source = %source, ?cache, "plugin compiled");
        Ok(plugin)
    }

    async fn deleted(&mut self, name: &str, cm: Option<&ConfigMap>) {
        let source = source_of(&self.namespace, name);
        self.metrics.plugin_source_gone(&source);
        let Some(known) = self.known.remove(name) else {
            return;
        };
        if let Some(kind) = known.shadowing {
            self.store.remove_shadow(&kind, &source);
            tracing::info!(source = %source, kind = %kind, "shadow unloaded: its ConfigMap was deleted");
            return;
        }
        if let Some(kind) = known.rolling_out {
            let rollout = self
                .store
                .list_rollouts()
                .into_iter()
                .find(|r| r.policy.source == source);
            self.store.remove_rollout(&kind, &source);
            tracing::info!(source = %source, kind = %kind, "rollout unloaded: its ConfigMap was deleted; every parent returns to the active version");
            if let Some(rollout) = rollout {
                self.metrics.rollout_ended(rollout.policy.name());
                if let Some(cm) = cm {
                    let message = format!(
                        "unloaded the rollout of {}: its ConfigMap was deleted; every parent of {kind} returns to the active version",
                        rollout.policy.plugin.label()
                    );
                    self.record(cm, KubeEventType::Normal, "PluginUnloaded", message)
                        .await;
                }
            }
            return;
        }
        let Some(policy) = known.policy else {
            return;
        };
        let Some(loaded) = self.store.get(&policy).filter(|p| p.source == source) else {
            return;
        };
        self.store.remove(&policy);
        tracing::info!(source = %source, plugin = loaded.plugin.label(), "plugin unloaded: its ConfigMap was deleted; its controller stops");
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
            action: crate::act::event_action("LoadPlugin", &note),
            note: Some(note),
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
    for annotation in [SUPERSEDED_BY, ROLLED_BACK] {
        if let Some(value) = cm.annotations().get(annotation) {
            text.push_str(annotation);
            text.push_str(value);
        }
    }
    super::pack::sha256_hex(text.as_bytes())
}

fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{Limits, Sandbox};
    use crate::load::pack::sha256_hex;

    fn misbehaving_pack(concurrency: u16, mode: Mode) -> PluginPack {
        let path = policy_host_test_plugins::build("misbehaving-policy").expect("plugin builds");
        let component = std::fs::read(path).expect("plugin file readable");
        PluginPack {
            sha256: sha256_hex(&component),
            component,
            pull: None,
            grants: Default::default(),
            limits: Limits::default(),
            concurrency,
            mode,
            rollout: None,
        }
    }

    /// A source whose API server is never called: these checks run before any write.
    fn source(store: PolicyStore) -> ConfigMapSource {
        let uri: http::Uri = "http://127.0.0.1:9".parse().expect("a valid URI");
        let client = Client::try_from(kube::Config::new(uri)).expect("a client");
        let loader = PluginLoader::new(Sandbox::new().expect("sandbox"), None);
        ConfigMapSource::new(
            client,
            "plugins".into(),
            loader,
            store,
            Metrics::new(),
            PackDefaults {
                limits: Limits::default(),
                concurrency: 8,
            },
        )
    }

    /// A shadow runs up to SHADOW_RUNS_IN_FLIGHT instances beside its active plugin: loaded
    /// past what the pool holds, the active plugins' decisions would get `SandboxBusy`
    /// (review L2). It is refused as an active plugin past the pool is.
    #[tokio::test]
    async fn a_shadow_that_would_overfill_the_pool_is_refused() {
        let store = PolicyStore::new();
        let source = source(store.clone());
        let cost = source
            .compile("probe", &misbehaving_pack(1, Mode::Active))
            .await
            .expect("the plugin compiles")
            .slot_cost();
        // The pool all but full: one instance short, fewer than a shadow's runs.
        let full = u16::try_from(INSTANCE_SLOTS / cost - 1).expect("a concurrency");
        let active = source
            .load(
                "configmap plugins/active",
                misbehaving_pack(full, Mode::Active),
                None,
                None,
            )
            .await
            .expect("the active plugin fits the pool");
        store.insert(active.loaded);
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("shadow".into()),
                namespace: Some("plugins".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let refused = source
            .load_shadow(
                &cm,
                "configmap plugins/shadow",
                misbehaving_pack(8, Mode::Shadow),
                None,
            )
            .await;
        match refused {
            Err(error @ RefusalError::PoolFull { .. }) => {
                assert_eq!(error.reason(), "PluginPoolFull");
                assert!(
                    error.to_string().contains("lower data.limits.concurrency"),
                    "{error}"
                );
            }
            Err(other) => panic!("expected PoolFull, got {other}"),
            Ok(_) => panic!("the shadow was loaded past the pool"),
        }
    }

    /// Pure arithmetic: the sizing rule of the instance pool.
    #[test]
    fn the_pool_counts_every_plugins_concurrency_and_shadow_runs() {
        assert_eq!(instances_at_once([(8, 1, 0)].into_iter()), 8);
        assert_eq!(
            instances_at_once([(8, 1, 1), (64, 1, 0)].into_iter()),
            8 + 4 + 64
        );
        // Two plugins at the highest concurrency, each with a shadow: more than the host holds.
        let two = instances_at_once([(64, 1, 1), (64, 1, 1)].into_iter());
        assert!(two > INSTANCE_SLOTS, "{two}");
        assert_eq!(
            instances_at_once([(u16::MAX, u32::MAX, 0)].into_iter()),
            u32::MAX
        );
    }
}
