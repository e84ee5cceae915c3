//! The plugins' domain metrics as the host exports them: one series per parent, labelled with
//! the parent's `namespace` and `name`, named `policy_host_plugin_<plugin>_<metric>`, within
//! bounds no plugin and no tenant can grow past.
//!
//! What a plugin may report is fixed by its declarations ([`crate::capability::metrics`]);
//! what it reports here are label values, bounded twice: at most
//! [`MAX_SERIES_PER_METRIC_PER_PARENT`] label-value combinations of one metric for one parent
//! (the plugin's label-value cardinality), and at most [`MAX_SERIES_PER_PLUGIN`] series of one
//! plugin in all. A sample past either is dropped and counted as refused; series that exist
//! keep updating.
//!
//! A gauge is what the latest decision for the parent said: each report replaces the parent's
//! gauges, so a gauge a decision left out (a replica that is gone) stops being exported. A
//! counter adds the increments of decisions that were carried out whole, so a decision that
//! failed and is decided again counts its event once. A parent's series go when it leaves the
//! parent cache, a policy's when its controller stops, and a metric's when the plugin that
//! reports no longer declares it (a new version).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::capability::metrics::{
    Declarations, MetricKind, MetricReport, Refusal, RefusalReason, SampleValue,
};

/// Label-value combinations one metric may have for one parent; past it, samples of new
/// combinations are refused (`SeriesPerParentCap`).
pub const MAX_SERIES_PER_METRIC_PER_PARENT: usize = 32;

/// Series one plugin may have, every parent and metric together; past it, samples of new series
/// are refused (`SeriesPerPluginCap`).
pub const MAX_SERIES_PER_PLUGIN: usize = 10_000;

/// The exported name of `metric` of `policy`, without the registry's `policy_host_` prefix
/// (counters get `_total` from the encoder).
pub fn exported_name(policy: &str, metric: &str) -> String {
    format!("plugin_{}_{metric}", policy.replace('-', "_"))
}

/// A parent: namespace and name.
type ParentKey = (String, String);

/// One series of a parent: the metric and its label values in declared order.
type SeriesKey = (String, Vec<String>);

/// What one policy's plugin reported, parent by parent.
#[derive(Debug, Default)]
struct PolicySeries {
    /// The declarations of the plugin that reported last.
    declared: Arc<Declarations>,
    parents: BTreeMap<ParentKey, BTreeMap<SeriesKey, SampleValue>>,
    /// Series in `parents`, all together.
    count: usize,
}

impl PolicySeries {
    /// Takes the declarations of the plugin reporting now: series of a metric it does not
    /// declare as before (gone, or another kind or labels) go.
    fn declared_by(&mut self, declared: &Arc<Declarations>) {
        if Arc::ptr_eq(&self.declared, declared) || self.declared == *declared {
            self.declared = declared.clone();
            return;
        }
        for series in self.parents.values_mut() {
            series.retain(|(name, _), _| self.declared.get(name) == declared.get(name));
        }
        self.parents.retain(|_, series| !series.is_empty());
        self.count = self.parents.values().map(BTreeMap::len).sum();
        self.declared = declared.clone();
    }

    fn forget(&mut self, parent: &ParentKey) {
        if let Some(series) = self.parents.remove(parent) {
            self.count -= series.len();
        }
    }
}

/// The plugins' series, by policy; encoded on each scrape as a [`Collector`].
#[derive(Debug, Default)]
pub struct PluginSeries {
    policies: Mutex<BTreeMap<String, PolicySeries>>,
}

impl PluginSeries {
    fn policies(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PolicySeries>> {
        self.policies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one decision's `report` for the parent `namespace/name` of `policy`, whose
    /// plugin declared `declared`: its gauges replace the parent's, its counters add when the
    /// decision was `carried_out`. Returns the samples refused at the series bounds.
    pub fn report(
        &self,
        policy: &str,
        (namespace, name): (&str, &str),
        declared: &Arc<Declarations>,
        report: &MetricReport,
        carried_out: bool,
    ) -> Vec<Refusal> {
        let mut policies = self.policies();
        let series = policies.entry(policy.to_string()).or_default();
        series.declared_by(declared);
        let parent = (namespace.to_string(), name.to_string());
        let mut refused = Vec::new();
        let mut held = series.parents.remove(&parent).unwrap_or_default();
        let before = held.len();
        held.retain(|_, value| matches!(value, SampleValue::Counter(_)));
        let mut count = series.count - (before - held.len());
        for sample in &report.samples {
            let key = (sample.name.clone(), sample.label_values.clone());
            if let Some(value) = held.get_mut(&key) {
                match (value, sample.value) {
                    (SampleValue::Gauge(v), SampleValue::Gauge(new)) => *v = new,
                    (SampleValue::Counter(v), SampleValue::Counter(add)) if carried_out => {
                        *v = v.saturating_add(add);
                    }
                    _ => {}
                }
                continue;
            }
            if matches!(sample.value, SampleValue::Counter(_)) && !carried_out {
                continue;
            }
            let of_metric = held.keys().filter(|(n, _)| *n == sample.name).count();
            if of_metric >= MAX_SERIES_PER_METRIC_PER_PARENT {
                refused.push(Refusal {
                    reason: RefusalReason::SeriesPerParentCap,
                    message: format!(
                        "metric `{}` has {MAX_SERIES_PER_METRIC_PER_PARENT} label-value combinations for {namespace}/{name} already; the sample of {:?} is dropped",
                        sample.name, sample.label_values
                    ),
                });
                continue;
            }
            if count >= MAX_SERIES_PER_PLUGIN {
                refused.push(Refusal {
                    reason: RefusalReason::SeriesPerPluginCap,
                    message: format!(
                        "policy `{policy}` has {MAX_SERIES_PER_PLUGIN} series already; the sample of `{}` for {namespace}/{name} is dropped",
                        sample.name
                    ),
                });
                continue;
            }
            held.insert(key, sample.value);
            count += 1;
        }
        series.count = count;
        if !held.is_empty() {
            series.parents.insert(parent, held);
        }
        refused
    }

    /// Removes every series of the parent `namespace/name` of `policy`.
    pub fn parent_gone(&self, policy: &str, namespace: &str, name: &str) {
        if let Some(series) = self.policies().get_mut(policy) {
            series.forget(&(namespace.to_string(), name.to_string()));
        }
    }

    /// Keeps the series of the parents of `policy` that `listed(namespace, name)` keeps (after
    /// a re-list: parents deleted while the watch was down go).
    pub fn retain_parents(&self, policy: &str, listed: impl Fn(&str, &str) -> bool) {
        if let Some(series) = self.policies().get_mut(policy) {
            let gone: Vec<ParentKey> = series
                .parents
                .keys()
                .filter(|(ns, name)| !listed(ns, name))
                .cloned()
                .collect();
            for parent in &gone {
                series.forget(parent);
            }
        }
    }

    /// Removes every series of `policy` (its controller stopped: unloaded).
    pub fn policy_gone(&self, policy: &str) {
        self.policies().remove(policy);
    }

    /// Series held for `policy`.
    pub fn series_of(&self, policy: &str) -> usize {
        self.policies().get(policy).map_or(0, |s| s.count)
    }
}

impl Collector for PluginSeries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let policies = self.policies();
        // Two plugins can spell one name (`a` + `b_c`, `a_b` + `c`): the first keeps it.
        let mut emitted = HashSet::new();
        for (policy, series) in policies.iter() {
            for declaration in series.declared.iter() {
                let name = exported_name(policy, &declaration.name);
                let mut of_metric: Vec<(&ParentKey, &Vec<String>, &SampleValue)> = Vec::new();
                for (parent, held) in &series.parents {
                    for ((metric, values), value) in held {
                        if *metric == declaration.name {
                            of_metric.push((parent, values, value));
                        }
                    }
                }
                if of_metric.is_empty() || !emitted.insert(name.clone()) {
                    continue;
                }
                let metric_type = match declaration.kind {
                    MetricKind::Gauge => MetricType::Gauge,
                    MetricKind::Counter => MetricType::Counter,
                };
                let mut family =
                    encoder.encode_descriptor(&name, &declaration.help, None, metric_type)?;
                for ((namespace, parent), values, value) in of_metric {
                    let mut labels = vec![
                        ("namespace".to_string(), namespace.clone()),
                        ("name".to_string(), parent.clone()),
                    ];
                    labels.extend(
                        declaration
                            .labels
                            .iter()
                            .cloned()
                            .zip(values.iter().cloned()),
                    );
                    let series = family.encode_family(&labels)?;
                    match value {
                        SampleValue::Gauge(v) => ConstGauge::new(*v).encode(series)?,
                        SampleValue::Counter(v) => ConstCounter::new(*v).encode(series)?,
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::metrics::{MetricDeclaration, Sample};
    use crate::metrics::Metrics;

    fn declarations() -> Arc<Declarations> {
        let mut declared = Declarations::default();
        for (name, kind, labels) in [
            ("members", MetricKind::Gauge, vec!["role"]),
            ("lag_seconds", MetricKind::Gauge, vec!["replica"]),
            ("failovers", MetricKind::Counter, vec![]),
        ] {
            declared
                .declare(MetricDeclaration {
                    name: name.into(),
                    kind,
                    help: format!("{name} of the cluster"),
                    labels: labels.into_iter().map(String::from).collect(),
                })
                .expect("valid");
        }
        Arc::new(declared)
    }

    fn gauge(name: &str, values: &[&str], value: f64) -> Sample {
        Sample {
            name: name.into(),
            label_values: values.iter().map(|v| v.to_string()).collect(),
            value: SampleValue::Gauge(value),
        }
    }

    fn counter(name: &str, add: u64) -> Sample {
        Sample {
            name: name.into(),
            label_values: Vec::new(),
            value: SampleValue::Counter(add),
        }
    }

    fn report(samples: Vec<Sample>) -> MetricReport {
        MetricReport {
            samples,
            refused: Vec::new(),
        }
    }

    #[test]
    fn each_parent_gets_its_own_series_labelled_with_its_namespace_and_name() {
        let metrics = Metrics::new();
        let declared = declarations();
        metrics.plugin_reported(
            "mariadb",
            ("db", "orders"),
            &declared,
            &report(vec![
                gauge("members", &["voter"], 3.0),
                counter("failovers", 1),
            ]),
            true,
        );
        metrics.plugin_reported(
            "mariadb",
            ("db", "users"),
            &declared,
            &report(vec![gauge("members", &["voter"], 1.0)]),
            true,
        );
        let text = metrics.render();
        for line in [
            "# TYPE policy_host_plugin_mariadb_members gauge",
            "# HELP policy_host_plugin_mariadb_members members of the cluster",
            "policy_host_plugin_mariadb_members{namespace=\"db\",name=\"orders\",role=\"voter\"} 3.0",
            "policy_host_plugin_mariadb_members{namespace=\"db\",name=\"users\",role=\"voter\"} 1.0",
            "# TYPE policy_host_plugin_mariadb_failovers counter",
            "policy_host_plugin_mariadb_failovers_total{namespace=\"db\",name=\"orders\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        // Declared but never reported: no empty family.
        assert!(!text.contains("lag_seconds"), "{text}");
    }

    #[test]
    fn a_gauge_is_what_the_last_decision_said_and_a_counter_counts_carried_out_decisions() {
        let series = PluginSeries::default();
        let declared = declarations();
        let parent = ("db", "orders");
        series.report(
            "mariadb",
            parent,
            &declared,
            &report(vec![
                gauge("lag_seconds", &["orders-1"], 2.0),
                gauge("lag_seconds", &["orders-2"], 0.5),
                counter("failovers", 1),
            ]),
            true,
        );
        assert_eq!(series.series_of("mariadb"), 3);
        // orders-2 is gone: its gauge goes with the next decision; a failed decision's
        // failover is not counted.
        series.report(
            "mariadb",
            parent,
            &declared,
            &report(vec![
                gauge("lag_seconds", &["orders-1"], 1.0),
                counter("failovers", 1),
            ]),
            false,
        );
        let key = |name: &str, values: &[&str]| -> SeriesKey {
            (
                name.to_string(),
                values.iter().map(|v| v.to_string()).collect(),
            )
        };
        {
            let policies = series.policies();
            let held = &policies["mariadb"].parents[&("db".to_string(), "orders".to_string())];
            assert_eq!(
                held.get(&key("lag_seconds", &["orders-1"])),
                Some(&SampleValue::Gauge(1.0))
            );
            assert_eq!(held.get(&key("lag_seconds", &["orders-2"])), None);
            assert_eq!(
                held.get(&key("failovers", &[])),
                Some(&SampleValue::Counter(1))
            );
        }
        assert_eq!(series.series_of("mariadb"), 2);
    }

    #[test]
    fn label_values_of_one_parent_are_capped() {
        let metrics = Metrics::new();
        let declared = declarations();
        let samples = (0..MAX_SERIES_PER_METRIC_PER_PARENT + 10)
            .map(|n| gauge("lag_seconds", &[format!("replica-{n}").as_str()], 1.0))
            .collect();
        metrics.plugin_reported(
            "mariadb",
            ("db", "orders"),
            &declared,
            &report(samples),
            true,
        );
        let text = metrics.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("policy_host_plugin_mariadb_lag_seconds{"))
            .count();
        assert_eq!(series, MAX_SERIES_PER_METRIC_PER_PARENT, "{text}");
        assert!(
            text.contains(
                "policy_host_metric_samples_refused_total{policy=\"mariadb\",reason=\"SeriesPerParentCap\"} 10"
            ),
            "{text}"
        );
        // Another parent has its own allowance.
        metrics.plugin_reported(
            "mariadb",
            ("db", "users"),
            &declared,
            &report(vec![gauge("lag_seconds", &["users-1"], 1.0)]),
            true,
        );
        assert!(metrics.render().contains(
            "policy_host_plugin_mariadb_lag_seconds{namespace=\"db\",name=\"users\",replica=\"users-1\"} 1.0"
        ));
    }

    #[test]
    fn a_plugin_has_a_bounded_number_of_series_in_all() {
        let series = PluginSeries::default();
        let declared = declarations();
        let parents = MAX_SERIES_PER_PLUGIN / MAX_SERIES_PER_METRIC_PER_PARENT + 2;
        let mut refused = Vec::new();
        for p in 0..parents {
            let samples = (0..MAX_SERIES_PER_METRIC_PER_PARENT)
                .map(|n| gauge("lag_seconds", &[n.to_string().as_str()], 1.0))
                .collect();
            refused.extend(series.report(
                "mariadb",
                ("db", format!("p{p}").as_str()),
                &declared,
                &report(samples),
                true,
            ));
        }
        assert_eq!(series.series_of("mariadb"), MAX_SERIES_PER_PLUGIN);
        assert!(!refused.is_empty());
        assert!(
            refused
                .iter()
                .all(|r| r.reason == RefusalReason::SeriesPerPluginCap)
        );
        // A parent that goes frees its series for others.
        series.parent_gone("mariadb", "db", "p0");
        assert_eq!(
            series.series_of("mariadb"),
            MAX_SERIES_PER_PLUGIN - MAX_SERIES_PER_METRIC_PER_PARENT
        );
    }

    #[test]
    fn series_go_with_their_parent_their_policy_and_their_declaration() {
        let metrics = Metrics::new();
        let declared = declarations();
        for parent in ["orders", "users", "stock"] {
            metrics.plugin_reported(
                "mariadb",
                ("db", parent),
                &declared,
                &report(vec![
                    gauge("members", &["voter"], 3.0),
                    counter("failovers", 2),
                ]),
                true,
            );
        }
        metrics.plugin_parent_gone("mariadb", "db", "orders");
        metrics.plugin_parents_retain("mariadb", |_, name| name != "users");
        let text = metrics.render();
        assert!(!text.contains("name=\"orders\""), "{text}");
        assert!(!text.contains("name=\"users\""), "{text}");
        assert!(text.contains("name=\"stock\""), "{text}");

        // A new version that no longer declares `failovers`: its series go.
        let mut fewer = Declarations::default();
        fewer
            .declare(MetricDeclaration {
                name: "members".into(),
                kind: MetricKind::Gauge,
                help: "members of the cluster".into(),
                labels: vec!["role".into()],
            })
            .expect("valid");
        metrics.plugin_reported(
            "mariadb",
            ("db", "stock"),
            &Arc::new(fewer),
            &report(vec![gauge("members", &["voter"], 3.0)]),
            true,
        );
        let text = metrics.render();
        assert!(!text.contains("failovers"), "{text}");
        assert!(
            text.contains("policy_host_plugin_mariadb_members{"),
            "{text}"
        );

        metrics.plugin_policy_gone("mariadb");
        assert!(!metrics.render().contains("policy_host_plugin_mariadb"));
    }

    #[test]
    fn a_dash_in_the_plugin_name_becomes_an_underscore() {
        assert_eq!(
            exported_name("etcd-backup", "snapshots"),
            "plugin_etcd_backup_snapshots"
        );
    }
}
