//! Domain metrics (contract 0.2.3): gauges and counters about the parent that the host exports
//! on its `/metrics`, one series per parent, as `policy_host_plugin_<plugin>_<name>` with the
//! parent's `namespace` and `name` as labels (counters end in `_total`).
//!
//! Declare each metric once, as a `const`, and list them in [`Plugin::metrics`]: the SDK
//! declares them to the host while `describe` runs, and the host refuses anything a decision
//! reports that was not declared (a name, a label), so a decision can only add values:
//!
//! ```
//! use policy_host_sdk::metrics::{Counter, Gauge, Metric};
//! use policy_host_sdk::prelude::*;
//!
//! const REPLICA_LAG: Gauge = Gauge::new("replica_lag_seconds", "How far each replica is behind the primary")
//!     .labelled(&["replica"]);
//! const FAILOVERS: Counter = Counter::new("failovers", "Primaries replaced after a failure");
//!
//! fn decide() -> Decision {
//!     Decision::nothing()
//!         .gauge(&REPLICA_LAG, &["db-1"], 0.25)
//!         .count(&FAILOVERS, &[], 1)
//! }
//! # let _ = [Metric::Gauge(&REPLICA_LAG), Metric::Counter(&FAILOVERS)];
//! # assert_eq!(decide().metrics.len(), 2);
//! ```
//!
//! A gauge is what the latest decision said: report every gauge you know in each decision (one
//! left out stops being exported for that parent). A counter adds what each decision counted,
//! once the host carried the decision out whole; count an event in the decision that makes it
//! happen (the failover's promotion), which the next decisions then observe as done. Label
//! values are bounded by the host (32 combinations of one metric per parent); name series after
//! what is bounded by the spec (a replica's pod name), never after what grows (a time, an ID).
//!
//! [`Plugin::metrics`]: crate::Plugin::metrics

/// A metric whose value goes up and down (members ready, lag in seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gauge {
    /// Lower snake case, at most 48 bytes, no `_total` (or other reserved) suffix.
    pub name: &'static str,
    /// One line of help.
    pub help: &'static str,
    /// Its own label names (at most 4; not `namespace`, `name` or `policy`).
    pub labels: &'static [&'static str],
}

impl Gauge {
    /// A gauge without labels.
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Gauge {
            name,
            help,
            labels: &[],
        }
    }

    /// The same gauge with these label names; samples give a value for each, in this order.
    pub const fn labelled(self, labels: &'static [&'static str]) -> Self {
        Gauge { labels, ..self }
    }
}

/// A metric that counts events (failovers, backups taken); exported with `_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    /// Lower snake case, at most 48 bytes, without `_total` (the host adds it).
    pub name: &'static str,
    /// One line of help.
    pub help: &'static str,
    /// Its own label names (at most 4; not `namespace`, `name` or `policy`).
    pub labels: &'static [&'static str],
}

impl Counter {
    /// A counter without labels.
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Counter {
            name,
            help,
            labels: &[],
        }
    }

    /// The same counter with these label names; samples give a value for each, in this order.
    pub const fn labelled(self, labels: &'static [&'static str]) -> Self {
        Counter { labels, ..self }
    }
}

/// A declared metric, as [`Plugin::metrics`](crate::Plugin::metrics) lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// A gauge.
    Gauge(&'static Gauge),
    /// A counter.
    Counter(&'static Counter),
}

impl Metric {
    /// The metric's name.
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Gauge(g) => g.name,
            Metric::Counter(c) => c.name,
        }
    }

    /// The metric's help.
    pub fn help(&self) -> &'static str {
        match self {
            Metric::Gauge(g) => g.help,
            Metric::Counter(c) => c.help,
        }
    }

    /// The metric's label names.
    pub fn labels(&self) -> &'static [&'static str] {
        match self {
            Metric::Gauge(g) => g.labels,
            Metric::Counter(c) => c.labels,
        }
    }
}

/// The value of one sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SampleValue {
    /// A gauge's value.
    Gauge(f64),
    /// An increment of a counter.
    Counter(u64),
}

/// One sample a decision reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric's name.
    pub name: String,
    /// Label name and value pairs, in the declared order.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: SampleValue,
}

impl Sample {
    /// A sample of `gauge`, with `values` for its labels in declared order.
    pub fn gauge(gauge: &Gauge, values: &[&str], value: f64) -> Self {
        Sample {
            name: gauge.name.to_owned(),
            labels: pairs(gauge.labels, values),
            value: SampleValue::Gauge(value),
        }
    }

    /// A sample adding `delta` to `counter`, with `values` for its labels in declared order.
    pub fn count(counter: &Counter, values: &[&str], delta: u64) -> Self {
        Sample {
            name: counter.name.to_owned(),
            labels: pairs(counter.labels, values),
            value: SampleValue::Counter(delta),
        }
    }

    /// The value of label `label`, if the sample has it.
    pub fn label(&self, label: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, v)| v.as_str())
    }
}

/// Label names zipped with values. A count that differs is the plugin's bug: the pairs keep
/// what both have, and the host refuses the sample (its declared labels need a value each);
/// [`check`] says so in native tests.
fn pairs(labels: &[&str], values: &[&str]) -> Vec<(String, String)> {
    debug_assert_eq!(
        labels.len(),
        values.len(),
        "label values {values:?} for labels {labels:?}"
    );
    labels
        .iter()
        .zip(values)
        .map(|(l, v)| ((*l).to_owned(), (*v).to_owned()))
        .collect()
}

/// Checks `samples` against `declared` as the host will: each sample's name declared with its
/// kind and exactly its labels. The native test harness runs this on every decision, so a
/// sample the host would refuse fails the plugin's own tests.
pub fn check(declared: &[Metric], samples: &[Sample]) -> Result<(), String> {
    for sample in samples {
        let Some(metric) = declared.iter().find(|m| m.name() == sample.name) else {
            return Err(format!(
                "metric `{}` is reported but not declared in Plugin::metrics",
                sample.name
            ));
        };
        let kind_matches = matches!(
            (metric, sample.value),
            (Metric::Gauge(_), SampleValue::Gauge(v)) if v.is_finite()
        ) || matches!(
            (metric, sample.value),
            (Metric::Counter(_), SampleValue::Counter(_))
        );
        if !kind_matches {
            return Err(format!(
                "metric `{}` is reported as {:?}, which its declaration (or a finite value) does not allow",
                sample.name, sample.value
            ));
        }
        let names: Vec<&str> = sample.labels.iter().map(|(l, _)| l.as_str()).collect();
        if names != metric.labels() {
            return Err(format!(
                "metric `{}` is reported with labels {names:?}, declared {:?}",
                sample.name,
                metric.labels()
            ));
        }
    }
    Ok(())
}

impl crate::contract::Decision {
    /// Reports `value` for `gauge` with `values` for its labels (in declared order).
    pub fn gauge(mut self, gauge: &Gauge, values: &[&str], value: f64) -> Self {
        self.metrics.push(Sample::gauge(gauge, values, value));
        self
    }

    /// Adds `delta` to `counter` with `values` for its labels (in declared order).
    pub fn count(mut self, counter: &Counter, values: &[&str], delta: u64) -> Self {
        self.metrics.push(Sample::count(counter, values, delta));
        self
    }

    /// The value this decision reports for `gauge` with these label values, if any.
    pub fn gauge_value(&self, gauge: &Gauge, values: &[&str]) -> Option<f64> {
        let wanted = pairs(gauge.labels, values);
        self.metrics.iter().find_map(|s| match s.value {
            SampleValue::Gauge(v) if s.name == gauge.name && s.labels == wanted => Some(v),
            _ => None,
        })
    }

    /// What this decision adds to `counter` with these label values (0 when nothing).
    pub fn counted(&self, counter: &Counter, values: &[&str]) -> u64 {
        let wanted = pairs(counter.labels, values);
        self.metrics
            .iter()
            .filter_map(|s| match s.value {
                SampleValue::Counter(v) if s.name == counter.name && s.labels == wanted => Some(v),
                _ => None,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Decision;

    const LAG: Gauge = Gauge::new("lag_seconds", "lag").labelled(&["replica"]);
    const FAILOVERS: Counter = Counter::new("failovers", "failovers");
    const UNDECLARED: Gauge = Gauge::new("undeclared", "not listed");

    #[test]
    fn samples_are_checked_against_the_declarations_as_the_host_does() {
        let declared = [Metric::Gauge(&LAG), Metric::Counter(&FAILOVERS)];
        let good = Decision::nothing()
            .gauge(&LAG, &["db-1"], 0.5)
            .count(&FAILOVERS, &[], 1);
        assert_eq!(check(&declared, &good.metrics), Ok(()));
        assert_eq!(good.gauge_value(&LAG, &["db-1"]), Some(0.5));
        assert_eq!(good.counted(&FAILOVERS, &[]), 1);

        let undeclared = Decision::nothing().gauge(&UNDECLARED, &[], 1.0);
        assert!(check(&declared, &undeclared.metrics).is_err());
        let not_finite = Decision::nothing().gauge(&LAG, &["db-1"], f64::INFINITY);
        assert!(check(&declared, &not_finite.metrics).is_err());
        let wrong_labels = Sample {
            name: "lag_seconds".into(),
            labels: vec![("pod".into(), "db-1".into())],
            value: SampleValue::Gauge(1.0),
        };
        assert!(check(&declared, &[wrong_labels]).is_err());
    }
}
