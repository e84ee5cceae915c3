//! Metrics: reconcile counts, errors and decision latency per policy, plugin loads and running
//! controllers, shadow comparisons, staged rollouts per version, what the watch caches hold and
//! every bound reached, in Prometheus text; beside them the plugins' own domain metrics, per
//! parent ([`plugin`]).
//!
//! Every label value that outside input chooses (a plugin's refusal reason, a ConfigMap's
//! name, a plugin metric's labels) is bounded, so no tenant or plugin can grow the number of
//! series.

pub mod plugin;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::capability::metrics::{Declarations, MetricReport};
use plugin::PluginSeries;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    policy: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowLabels {
    policy: String,
    shadow: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApplyLabels {
    policy: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoadLabels {
    source: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    policy: String,
    cache: String,
}

/// A version in a rollout: `version` is the plugin's `name@version`, the candidate's or the
/// active one's (bounded: only loaded plugins).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    policy: String,
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutOutcomeLabels {
    policy: String,
    version: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedSampleLabels {
    policy: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabels {
    bound: String,
}

/// Distinct `source` label values of `plugin_loads_total`. A source is a plugin ConfigMap's
/// name, and whoever may create ConfigMaps in the plugin namespace picks names (review L3):
/// past the bound, new sources count under [`OTHER_SOURCE`]; a deleted ConfigMap's series go.
pub const MAX_LOAD_SOURCES: usize = 64;

/// The `source` label of plugin loads whose source is past [`MAX_LOAD_SOURCES`].
pub const OTHER_SOURCE: &str = "other";

/// Distinct `reason` label values kept per policy. Refusal reasons are the plugin's own text,
/// so without a bound a plugin could mint one series per reconcile (review #16); past the
/// bound, new reasons count under [`OTHER_REASON`].
pub const MAX_REASONS_PER_POLICY: usize = 32;

/// The `reason` label of failures whose reason is past [`MAX_REASONS_PER_POLICY`].
pub const OTHER_REASON: &str = "OtherReason";

/// The longest `reason` label value, in bytes (longer ones are cut at a character boundary).
const MAX_REASON_BYTES: usize = 64;

/// The host's metrics. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    reconciles: Family<PolicyLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    decision_seconds: Family<PolicyLabels, Histogram>,
    plugin_loads: Family<LoadLabels, Counter>,
    controllers: Family<PolicyLabels, Gauge>,
    shadow_decisions: Family<ShadowLabels, Counter>,
    controller_restarts: Family<PolicyLabels, Counter>,
    reconciles_deferred: Family<PolicyLabels, Counter>,
    reconciles_abandoned: Family<PolicyLabels, Counter>,
    cache_objects: Family<CacheLabels, Gauge>,
    cache_bytes: Family<CacheLabels, Gauge>,
    cache_ignored: Family<CacheLabels, Counter>,
    bounds_reached: Family<BoundLabels, Counter>,
    child_applies: Family<ApplyLabels, Counter>,
    rollout_decisions: Family<RolloutOutcomeLabels, Counter>,
    rollout_parents: Family<RolloutLabels, Gauge>,
    /// The versions with a `rollout_parents` series per policy, removed when its rollout ends.
    rollout_versions: Arc<Mutex<HashMap<String, HashSet<String>>>>,
    refused_samples: Family<RefusedSampleLabels, Counter>,
    /// The plugins' domain metrics, per parent.
    plugin_series: Arc<PluginSeries>,
    /// The `reason` values seen per policy, to bound the series.
    reasons: Arc<Mutex<HashMap<String, HashSet<String>>>>,
    /// The `outcome` values seen per load source, to bound the series and remove them.
    load_sources: Arc<Mutex<HashMap<String, HashSet<String>>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("policy_host");
        let reconciles = Family::<PolicyLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        // 10 µs .. ~5 s: sandboxed decisions are expected in the tens of µs, app-calls in ms.
        let decision_seconds = Family::<PolicyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_01, 2.5, 15))
        });
        registry.register(
            "reconciles",
            "Reconciles started, per policy",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, per policy and reason",
            errors.clone(),
        );
        registry.register(
            "decision_duration_seconds",
            "Time a plugin took to decide (instantiate + reconcile, app-calls included)",
            decision_seconds.clone(),
        );
        let plugin_loads = Family::<LoadLabels, Counter>::default();
        registry.register(
            "plugin_loads",
            "Plugin load attempts per source and outcome (Loaded, Swapped, Unloaded, or the refusal reason)",
            plugin_loads.clone(),
        );
        let controllers = Family::<PolicyLabels, Gauge>::default();
        registry.register(
            "controllers",
            "1 while the controller of a policy runs, 0 once stopped",
            controllers.clone(),
        );
        let shadow_decisions = Family::<ShadowLabels, Counter>::default();
        registry.register(
            "shadow_decisions",
            "Decisions of a shadow plugin compared with the active one's, per outcome (same, different; dropped when too many shadow runs were in flight, failed when the run itself failed)",
            shadow_decisions.clone(),
        );
        let controller_restarts = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "controller_restarts",
            "Controllers restarted by the supervisor after they ended on their own (a panic or a lost watch)",
            controller_restarts.clone(),
        );
        let reconciles_deferred = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "reconciles_deferred",
            "Reconciles not decided because the parent's cached view predates the host's own status write (its watch event was still on the way); each retried shortly",
            reconciles_deferred.clone(),
        );
        let reconciles_abandoned = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "reconciles_abandoned",
            "Decisions not carried out because the parent left this host's parent cache (moved to another shard by its label, or deleted) while the plugin decided",
            reconciles_abandoned.clone(),
        );
        let cache_objects = Family::<CacheLabels, Gauge>::default();
        registry.register(
            "cache_objects",
            "Objects a policy's watch cache holds, per cache (`parents`, or a child kind: only children a parent of the policy's kind controls)",
            cache_objects.clone(),
        );
        let cache_bytes = Family::<CacheLabels, Gauge>::default();
        registry.register(
            "cache_bytes",
            "Approximate bytes (as JSON) of the objects a policy's watch cache holds, per cache",
            cache_bytes.clone(),
        );
        let cache_ignored = Family::<CacheLabels, Counter>::default();
        registry.register(
            "cache_ignored",
            "Labelled objects a child cache did not keep because no object of the policy's kind controls them (anyone may set the label on their own objects)",
            cache_ignored.clone(),
        );
        let bounds_reached = Family::<BoundLabels, Counter>::default();
        registry.register(
            "bounds_reached",
            "Times a bound on what outside input can grow was reached and something was refused or folded, per bound (ARCHITECTURE.md, \"Bounds\")",
            bounds_reached.clone(),
        );
        let child_applies = Family::<ApplyLabels, Counter>::default();
        registry.register(
            "child_applies",
            "Child applies decided, per policy and outcome: sent to the API server, or skipped because the child was still what the host's last apply of the same body left (same uid and resourceVersion)",
            child_applies.clone(),
        );
        let rollout_decisions = Family::<RolloutOutcomeLabels, Counter>::default();
        registry.register(
            "rollout_decisions",
            "Decisions made while a staged rollout runs, per version (the candidate's or the active one's, name@version) and outcome (succeeded, failed: what counts against a version in the rollback judgement)",
            rollout_decisions.clone(),
        );
        let rollout_parents = Family::<RolloutLabels, Gauge>::default();
        registry.register(
            "rollout_parents",
            "Parents each version of a staged rollout decides for (name@version), as last reconciled",
            rollout_parents.clone(),
        );
        let refused_samples = Family::<RefusedSampleLabels, Counter>::default();
        registry.register(
            "metric_samples_refused",
            "Samples of a plugin's domain metrics the host refused, per policy and reason (Undeclared, UndeclaredLabel, WrongKind, LabelValueTooLong, NotFinite, TooManySamples, SeriesPerParentCap, SeriesPerPluginCap, NotNow)",
            refused_samples.clone(),
        );
        let plugin_series = Arc::new(PluginSeries::default());
        registry.register_collector(Box::new(plugin_series.clone()));
        Self {
            registry: Arc::new(registry),
            rollout_decisions,
            rollout_parents,
            rollout_versions: Arc::new(Mutex::new(HashMap::new())),
            refused_samples,
            plugin_series,
            cache_objects,
            cache_bytes,
            cache_ignored,
            bounds_reached,
            load_sources: Arc::new(Mutex::new(HashMap::new())),
            child_applies,
            controller_restarts,
            reconciles_deferred,
            reconciles_abandoned,
            reasons: Arc::new(Mutex::new(HashMap::new())),
            shadow_decisions,
            reconciles,
            errors,
            decision_seconds,
            plugin_loads,
            controllers,
        }
    }

    /// Counts a reconcile of `policy`.
    pub fn reconcile_started(&self, policy: &str) {
        self.reconciles
            .get_or_create(&PolicyLabels {
                policy: policy.into(),
            })
            .inc();
    }

    /// Counts a reconcile of `policy` deferred until the host's own status write reaches its
    /// parent cache.
    pub fn reconcile_deferred(&self, policy: &str) {
        self.reconciles_deferred
            .get_or_create(&PolicyLabels {
                policy: policy.into(),
            })
            .inc();
    }

    /// Counts a decision of `policy` not carried out because its parent left the cache.
    pub fn reconcile_abandoned(&self, policy: &str) {
        self.reconciles_abandoned
            .get_or_create(&PolicyLabels {
                policy: policy.into(),
            })
            .inc();
    }

    /// Counts the child applies of one decision: `sent` to the API server, `skipped` as
    /// unchanged.
    pub fn child_applies(&self, policy: &str, sent: u32, skipped: u32) {
        for (outcome, count) in [("sent", sent), ("skipped", skipped)] {
            if count > 0 {
                self.child_applies
                    .get_or_create(&ApplyLabels {
                        policy: policy.into(),
                        outcome,
                    })
                    .inc_by(u64::from(count));
            }
        }
    }

    /// Counts a failed reconcile. At most [`MAX_REASONS_PER_POLICY`] reasons get their own
    /// series per policy.
    pub fn reconcile_failed(&self, policy: &str, reason: &str) {
        let reason = self.bounded_reason(policy, reason);
        self.errors
            .get_or_create(&ErrorLabels {
                policy: policy.into(),
                reason,
            })
            .inc();
    }

    fn bounded_reason(&self, policy: &str, reason: &str) -> String {
        let mut cut = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        let reason = &reason[..cut];
        let mut reasons = self.reasons.lock().unwrap_or_else(|p| p.into_inner());
        let seen = reasons.entry(policy.to_string()).or_default();
        if seen.contains(reason) {
            return reason.to_string();
        }
        if seen.len() >= MAX_REASONS_PER_POLICY {
            return OTHER_REASON.to_string();
        }
        seen.insert(reason.to_string());
        reason.to_string()
    }

    /// Counts a decision of `version` of `policy` during a rollout.
    pub fn rollout_decided(&self, policy: &str, version: &str, failed: bool) {
        self.rollout_decisions
            .get_or_create(&RolloutOutcomeLabels {
                policy: policy.into(),
                version: version.into(),
                outcome: if failed { "failed" } else { "succeeded" },
            })
            .inc();
    }

    /// Sets how many parents `version` of `policy` decides for during a rollout.
    pub fn rollout_parents(&self, policy: &str, version: &str, parents: usize) {
        self.rollout_versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(policy.to_string())
            .or_default()
            .insert(version.to_string());
        self.rollout_parents
            .get_or_create(&RolloutLabels {
                policy: policy.into(),
                version: version.into(),
            })
            .set(i64::try_from(parents).unwrap_or(i64::MAX));
    }

    /// Removes the `rollout_parents` series of `policy`: its rollout ended.
    pub fn rollout_ended(&self, policy: &str) {
        let versions = self
            .rollout_versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(policy)
            .unwrap_or_default();
        for version in versions {
            self.rollout_parents.remove(&RolloutLabels {
                policy: policy.into(),
                version,
            });
        }
    }

    /// Counts a restart of the controller of `policy` after it ended on its own.
    pub fn controller_restarted(&self, policy: &str) {
        self.controller_restarts
            .get_or_create(&PolicyLabels {
                policy: policy.into(),
            })
            .inc();
    }

    /// Records how long a decision took.
    pub fn decision_took(&self, policy: &str, took: Duration) {
        self.decision_seconds
            .get_or_create(&PolicyLabels {
                policy: policy.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a shadow decision of `shadow` (name@version) next to the active `policy`.
    pub fn shadow_compared(&self, policy: &str, shadow: &str, outcome: &str) {
        self.shadow_decisions
            .get_or_create(&ShadowLabels {
                policy: policy.into(),
                shadow: shadow.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts a plugin load attempt from `source` (e.g. `configmap ns/name`) with its outcome.
    /// At most [`MAX_LOAD_SOURCES`] sources get their own series.
    pub fn plugin_load(&self, source: &str, outcome: &str) {
        let source = {
            let mut sources = self.load_sources.lock().unwrap_or_else(|p| p.into_inner());
            if !sources.contains_key(source) && sources.len() >= MAX_LOAD_SOURCES {
                None
            } else {
                sources
                    .entry(source.to_string())
                    .or_default()
                    .insert(outcome.to_string());
                Some(source.to_string())
            }
        };
        let source = source.unwrap_or_else(|| {
            self.bound_reached(
                "plugin_load_sources",
                &format!("more than {MAX_LOAD_SOURCES} plugin sources; further ones count as source=\"{OTHER_SOURCE}\""),
            );
            OTHER_SOURCE.to_string()
        });
        self.plugin_loads
            .get_or_create(&LoadLabels {
                source,
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Removes the load series of `source`, whose ConfigMap was deleted.
    pub fn plugin_source_gone(&self, source: &str) {
        let outcomes = self
            .load_sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(source);
        for outcome in outcomes.into_iter().flatten() {
            self.plugin_loads.remove(&LoadLabels {
                source: source.to_string(),
                outcome,
            });
        }
    }

    /// Records what a policy's watch cache (`parents` or a child kind) holds.
    pub fn cache_held(&self, policy: &str, cache: &str, objects: usize, bytes: usize) {
        let labels = CacheLabels {
            policy: policy.into(),
            cache: cache.into(),
        };
        self.cache_objects
            .get_or_create(&labels)
            .set(i64::try_from(objects).unwrap_or(i64::MAX));
        self.cache_bytes
            .get_or_create(&labels)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Counts a labelled object the child cache `cache` of `policy` did not keep.
    pub fn cache_ignored(&self, policy: &str, cache: &str) {
        self.cache_ignored
            .get_or_create(&CacheLabels {
                policy: policy.into(),
                cache: cache.into(),
            })
            .inc();
    }

    /// Counts one refusal at `bound` and logs `what` as a warning: the first time, then at
    /// every power of two, so a tenant pressing on a bound cannot flood the log either.
    pub fn bound_reached(&self, bound: &str, what: &str) {
        let count = self
            .bounds_reached
            .get_or_create(&BoundLabels {
                bound: bound.into(),
            })
            .inc()
            + 1;
        if count.is_power_of_two() {
            tracing::warn!(bound, times = count, "bound reached: {what}");
        }
    }

    /// Records whether the controller of `policy` runs.
    pub fn controller_running(&self, policy: &str, running: bool) {
        self.controllers
            .get_or_create(&PolicyLabels {
                policy: policy.into(),
            })
            .set(i64::from(running));
    }

    /// Exports what one decision of `policy` for `parent` (namespace, name) reported of its
    /// plugin's domain metrics ([`plugin`]): gauges replace the parent's, counters add when the
    /// decision was `carried_out`. Every refused sample is counted by reason and logged as a
    /// warning the first time and at every power of two.
    pub fn plugin_reported(
        &self,
        policy: &str,
        parent: (&str, &str),
        declared: &Arc<Declarations>,
        report: &MetricReport,
        carried_out: bool,
    ) {
        let capped = self
            .plugin_series
            .report(policy, parent, declared, report, carried_out);
        for refusal in report.refused.iter().chain(&capped) {
            let count = self
                .refused_samples
                .get_or_create(&RefusedSampleLabels {
                    policy: policy.into(),
                    reason: refusal.reason.as_str(),
                })
                .inc()
                + 1;
            if count.is_power_of_two() {
                tracing::warn!(
                    policy,
                    parent = %format!("{}/{}", parent.0, parent.1),
                    reason = refusal.reason.as_str(),
                    times = count,
                    "plugin metric sample refused: {}",
                    refusal.message
                );
            }
        }
    }

    /// Removes the plugin series of the parent `namespace/name` of `policy` (it went).
    pub fn plugin_parent_gone(&self, policy: &str, namespace: &str, name: &str) {
        self.plugin_series.parent_gone(policy, namespace, name);
    }

    /// Keeps the plugin series of the parents of `policy` that `listed(namespace, name)` keeps.
    pub fn plugin_parents_retain(&self, policy: &str, listed: impl Fn(&str, &str) -> bool) {
        self.plugin_series.retain_parents(policy, listed);
    }

    /// Removes every plugin series of `policy` (its controller stopped).
    pub fn plugin_policy_gone(&self, policy: &str) {
        self.plugin_series.policy_gone(policy);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thousand_plugin_reasons_make_a_bounded_number_of_series() {
        let metrics = Metrics::new();
        for n in 0..1000 {
            metrics.reconcile_failed("etcd", &format!("Reason{n}"));
        }
        metrics.reconcile_failed("etcd", &"é".repeat(100));
        let text = metrics.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("policy_host_reconcile_errors_total{"))
            .count();
        assert_eq!(series, MAX_REASONS_PER_POLICY + 1, "{text}");
        assert!(
            text.contains(&format!(
                "policy_host_reconcile_errors_total{{policy=\"etcd\",reason=\"{OTHER_REASON}\"}} 969"
            )),
            "{text}"
        );
        // A reason seen before the bound keeps its own series.
        metrics.reconcile_failed("etcd", "Reason0");
        assert!(
            metrics.render().contains(
                "policy_host_reconcile_errors_total{policy=\"etcd\",reason=\"Reason0\"} 2"
            )
        );
    }

    /// One series per ConfigMap name ever seen would grow with every pack created and
    /// deleted (review L3): the sources are bounded, and a deleted ConfigMap's series go.
    #[test]
    fn a_thousand_plugin_config_maps_make_a_bounded_number_of_load_series() {
        let metrics = Metrics::new();
        for n in 0..1000 {
            metrics.plugin_load(&format!("configmap ops/pack-{n}"), "PluginChecksumMismatch");
        }
        let series = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with("policy_host_plugin_loads_total{"))
                .count()
        };
        let text = metrics.render();
        assert_eq!(series(&text), MAX_LOAD_SOURCES + 1, "{text}");
        assert!(
            text.contains(&format!(
                "policy_host_plugin_loads_total{{source=\"{OTHER_SOURCE}\",outcome=\"PluginChecksumMismatch\"}} {}",
                1000 - MAX_LOAD_SOURCES
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "policy_host_bounds_reached_total{{bound=\"plugin_load_sources\"}} {}",
                1000 - MAX_LOAD_SOURCES
            )),
            "{text}"
        );
        // A deleted ConfigMap's series go, and free a place for another.
        metrics.plugin_load("configmap ops/pack-0", "Loaded");
        metrics.plugin_source_gone("configmap ops/pack-0");
        let text = metrics.render();
        assert!(!text.contains("source=\"configmap ops/pack-0\""), "{text}");
        metrics.plugin_load("configmap ops/late", "Loaded");
        assert!(metrics.render().contains(
            "policy_host_plugin_loads_total{source=\"configmap ops/late\",outcome=\"Loaded\"} 1"
        ));
    }

    #[test]
    fn rendered_text_names_each_policy() {
        let metrics = Metrics::new();
        metrics.reconcile_started("etcd");
        metrics.reconcile_failed("etcd", "PluginCrashed");
        metrics.decision_took("etcd", Duration::from_micros(50));
        metrics.plugin_load("configmap ops/etcd", "PluginChecksumMismatch");
        metrics.controller_running("etcd", true);
        metrics.child_applies("etcd", 1, 2);
        let text = metrics.render();
        assert!(
            text.contains("policy_host_child_applies_total{policy=\"etcd\",outcome=\"skipped\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("policy_host_plugin_loads_total{source=\"configmap ops/etcd\",outcome=\"PluginChecksumMismatch\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("policy_host_controllers{policy=\"etcd\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("policy_host_reconciles_total{policy=\"etcd\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "policy_host_reconcile_errors_total{policy=\"etcd\",reason=\"PluginCrashed\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("policy_host_decision_duration_seconds_count{policy=\"etcd\"} 1"),
            "{text}"
        );
    }
}
