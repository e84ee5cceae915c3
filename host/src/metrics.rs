//! Metrics: reconcile counts, errors and decision latency per policy, plugin loads and running
//! controllers, shadow comparisons, in Prometheus text.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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
    child_applies: Family<ApplyLabels, Counter>,
    /// The `reason` values seen per policy, to bound the series.
    reasons: Arc<Mutex<HashMap<String, HashSet<String>>>>,
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
        let child_applies = Family::<ApplyLabels, Counter>::default();
        registry.register(
            "child_applies",
            "Child applies decided, per policy and outcome: sent to the API server, or skipped because the child was still what the host's last apply of the same body left (same uid and resourceVersion)",
            child_applies.clone(),
        );
        Self {
            registry: Arc::new(registry),
            child_applies,
            controller_restarts,
            reconciles_deferred,
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
    pub fn plugin_load(&self, source: &str, outcome: &str) {
        self.plugin_loads
            .get_or_create(&LoadLabels {
                source: source.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Records whether the controller of `policy` runs.
    pub fn controller_running(&self, policy: &str, running: bool) {
        self.controllers
            .get_or_create(&PolicyLabels {
                policy: policy.into(),
            })
            .set(i64::from(running));
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
