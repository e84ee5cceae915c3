//! Domain metrics a plugin reports (contract 0.2.3, the `metrics` import): the declarations it
//! makes while `describe` runs, the samples it reports while `reconcile` runs, and the bounds
//! both are held to. What the host then exports is [`crate::metrics::plugin`]'s.
//!
//! Why declared up front and by the component: the names and label names a plugin may use are
//! then fixed when it loads, covered by the pack's signature like the rest of the component, and
//! shown by `policy-host validate`; a decision can only add values, never a new name, so no
//! plugin can grow the host's `/metrics` by inventing names (the label values it picks are
//! bounded by [`crate::metrics::plugin`]). Why an import rather than a field of `policy-info`:
//! a new field in a record `describe` returns is a breaking type change (a new minor, frozen
//! bindings, conversions), while a new import is additive (0.2.3), so every 0.2 plugin keeps
//! loading unchanged.

use std::collections::BTreeMap;

use crate::contract::metrics as wit;

/// Metrics one plugin may declare.
pub const MAX_METRICS_PER_PLUGIN: usize = 32;
/// Label names one metric may declare (besides the `namespace` and `name` the host sets).
pub const MAX_LABELS_PER_METRIC: usize = 4;
/// The longest metric name, in bytes (the host adds `policy_host_plugin_<plugin>_`).
pub const MAX_NAME_BYTES: usize = 48;
/// The longest help text, in bytes.
pub const MAX_HELP_BYTES: usize = 256;
/// The longest label value, in bytes.
pub const MAX_LABEL_VALUE_BYTES: usize = 128;
/// Samples one decision may report; more are refused.
pub const MAX_SAMPLES_PER_DECISION: usize = 256;

/// Labels the host sets on every plugin series, which a plugin may not declare.
pub const HOST_LABELS: [&str; 3] = ["namespace", "name", "policy"];

/// Suffixes Prometheus and OpenMetrics give a meaning (`_total` the host adds to counters).
const RESERVED_SUFFIXES: [&str; 6] = ["_total", "_count", "_sum", "_bucket", "_created", "_info"];

/// Whether a metric is a gauge or a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// A value that goes up and down; each decision reports the whole set.
    Gauge,
    /// A count that only goes up; the host adds each carried-out decision's increments.
    Counter,
}

impl MetricKind {
    /// `gauge` or `counter`.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::Counter => "counter",
        }
    }
}

/// One metric a plugin declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricDeclaration {
    /// Lower snake case, without the host's prefix.
    pub name: String,
    /// Gauge or counter.
    pub kind: MetricKind,
    /// Help text.
    pub help: String,
    /// The metric's own label names, in declared order.
    pub labels: Vec<String>,
}

/// Every metric a plugin declared, by name. Empty for a plugin built before 0.2.3 or one that
/// declares none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Declarations(BTreeMap<String, MetricDeclaration>);

impl Declarations {
    /// Adds a declaration, if it keeps every bound; the error says what to fix.
    pub fn declare(&mut self, declaration: MetricDeclaration) -> Result<(), String> {
        let name = &declaration.name;
        check_name("metric name", name, MAX_NAME_BYTES)?;
        if let Some(suffix) = RESERVED_SUFFIXES.iter().find(|s| name.ends_with(*s)) {
            return Err(format!(
                "metric name `{name}` ends in `{suffix}`, which Prometheus reserves (the host adds `_total` to counters); name it without the suffix"
            ));
        }
        if self.0.contains_key(name) {
            return Err(format!(
                "metric `{name}` is declared twice; declare it once"
            ));
        }
        if self.0.len() >= MAX_METRICS_PER_PLUGIN {
            return Err(format!(
                "metric `{name}` is past the {MAX_METRICS_PER_PLUGIN} metrics a plugin may declare; report fewer metrics, with labels"
            ));
        }
        if declaration.help.len() > MAX_HELP_BYTES || declaration.help.contains(['\n', '\\']) {
            return Err(format!(
                "the help of metric `{name}` is not one line of at most {MAX_HELP_BYTES} bytes without a backslash; shorten it"
            ));
        }
        if declaration.labels.len() > MAX_LABELS_PER_METRIC {
            return Err(format!(
                "metric `{name}` declares {} labels, more than {MAX_LABELS_PER_METRIC}; drop some",
                declaration.labels.len()
            ));
        }
        for (i, label) in declaration.labels.iter().enumerate() {
            check_name(&format!("label of metric `{name}`"), label, MAX_NAME_BYTES)?;
            if HOST_LABELS.contains(&label.as_str()) {
                return Err(format!(
                    "metric `{name}` declares the label `{label}`, which the host sets to the parent's (it names {}); pick another name",
                    HOST_LABELS.join(", ")
                ));
            }
            if declaration.labels[..i].contains(label) {
                return Err(format!(
                    "metric `{name}` declares the label `{label}` twice"
                ));
            }
        }
        self.0.insert(name.clone(), declaration);
        Ok(())
    }

    /// The declaration of `name`, if the plugin declared it.
    pub fn get(&self, name: &str) -> Option<&MetricDeclaration> {
        self.0.get(name)
    }

    /// Every declaration, by name.
    pub fn iter(&self) -> impl Iterator<Item = &MetricDeclaration> {
        self.0.values()
    }

    /// Whether the plugin declared no metric.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks one sample against the declarations: `name` declared as `kind`, `labels` exactly
    /// the declared label names, each value short enough. Returns the label values in declared
    /// order.
    pub fn check(
        &self,
        name: &str,
        kind: MetricKind,
        labels: &[(String, String)],
    ) -> Result<Vec<String>, Refusal> {
        let declared = self.get(name).ok_or_else(|| Refusal {
            reason: RefusalReason::Undeclared,
            message: format!("metric `{name}` was not declared in describe; declare it there"),
        })?;
        if declared.kind != kind {
            return Err(Refusal {
                reason: RefusalReason::WrongKind,
                message: format!(
                    "metric `{name}` was declared a {}, not a {}",
                    declared.kind.as_str(),
                    kind.as_str()
                ),
            });
        }
        if let Some((label, _)) = labels.iter().find(|(l, _)| !declared.labels.contains(l)) {
            return Err(Refusal {
                reason: RefusalReason::UndeclaredLabel,
                message: format!(
                    "metric `{name}` has no label `{label}` (declared: {}); declare it in describe",
                    declared.labels.join(", ")
                ),
            });
        }
        let mut values = Vec::with_capacity(declared.labels.len());
        for label in &declared.labels {
            let mut given = labels.iter().filter(|(l, _)| l == label);
            let (Some((_, value)), None) = (given.next(), given.next()) else {
                return Err(Refusal {
                    reason: RefusalReason::UndeclaredLabel,
                    message: format!(
                        "metric `{name}` needs exactly one value of its label `{label}`"
                    ),
                });
            };
            if value.len() > MAX_LABEL_VALUE_BYTES {
                return Err(Refusal {
                    reason: RefusalReason::LabelValueTooLong,
                    message: format!(
                        "the value of label `{label}` of metric `{name}` is {} bytes, more than {MAX_LABEL_VALUE_BYTES}",
                        value.len()
                    ),
                });
            }
            values.push(value.clone());
        }
        Ok(values)
    }
}

/// `what` is a valid lower-snake-case name of at most `max` bytes, or the error says why not.
fn check_name(what: &str, name: &str, max: usize) -> Result<(), String> {
    let starts_with_letter = name.starts_with(|c: char| c.is_ascii_lowercase());
    let snake = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !starts_with_letter || !snake || name.len() > max {
        return Err(format!(
            "{what} `{name}` is not lower snake case (a-z, 0-9, _, starting with a letter) of at most {max} bytes"
        ));
    }
    Ok(())
}

/// Why a sample was refused, as the `reason` label of
/// `policy_host_plugin_metric_samples_refused_total`: a closed set, so the label is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// The metric was not declared.
    Undeclared,
    /// A label was not declared, or a declared one had no value (or two).
    UndeclaredLabel,
    /// A gauge was added to, or a counter set.
    WrongKind,
    /// A label value was longer than [`MAX_LABEL_VALUE_BYTES`].
    LabelValueTooLong,
    /// A gauge's value was NaN or infinite.
    NotFinite,
    /// The decision reported more than [`MAX_SAMPLES_PER_DECISION`] samples.
    TooManySamples,
    /// A new label-value combination past the per-parent cap of its metric.
    SeriesPerParentCap,
    /// A new series past the plugin's cap on series in all.
    SeriesPerPluginCap,
    /// Reported outside `reconcile` (in `describe` or `finalize`), or declared outside `describe`.
    NotNow,
}

impl RefusalReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Undeclared => "Undeclared",
            RefusalReason::UndeclaredLabel => "UndeclaredLabel",
            RefusalReason::WrongKind => "WrongKind",
            RefusalReason::LabelValueTooLong => "LabelValueTooLong",
            RefusalReason::NotFinite => "NotFinite",
            RefusalReason::TooManySamples => "TooManySamples",
            RefusalReason::SeriesPerParentCap => "SeriesPerParentCap",
            RefusalReason::SeriesPerPluginCap => "SeriesPerPluginCap",
            RefusalReason::NotNow => "NotNow",
        }
    }
}

/// A refused sample: why, and what to tell the plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The bounded reason.
    pub reason: RefusalReason,
    /// What was wrong, for the plugin and the host's log.
    pub message: String,
}

/// The value of one sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SampleValue {
    /// A gauge's new value.
    Gauge(f64),
    /// An increment of a counter.
    Counter(u64),
}

/// One accepted sample: a declared metric, its label values in declared order, its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric's declared name.
    pub name: String,
    /// Values of the declared labels, in declared order.
    pub label_values: Vec<String>,
    /// The value.
    pub value: SampleValue,
}

/// What one decision reported: the samples accepted and the refusals, to count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricReport {
    /// Accepted samples, in the order reported; a later sample of the same series wins (a
    /// gauge) or adds (a counter).
    pub samples: Vec<Sample>,
    /// Why samples were refused.
    pub refused: Vec<Refusal>,
}

/// The `metrics` import's state in one instance: declaring while `describe` runs, reporting
/// while `reconcile` runs, refusing otherwise (`finalize`: the parent is going, and its series
/// with it).
#[derive(Debug, Default)]
pub enum MetricsDoor {
    /// `describe` runs: declarations are collected, and refusals, which fail the load.
    Declaring {
        /// Accepted so far.
        declared: Declarations,
        /// Why declarations were refused.
        refused: Vec<String>,
    },
    /// `reconcile` runs: samples of what the plugin declared are collected.
    Reporting {
        /// What the plugin declared when it loaded.
        declared: std::sync::Arc<Declarations>,
        /// What it reported so far.
        report: MetricReport,
    },
    /// Nothing may be declared or reported.
    #[default]
    Closed,
}

impl MetricsDoor {
    /// The door of an instance running `describe`.
    pub fn declaring() -> Self {
        MetricsDoor::Declaring {
            declared: Declarations::default(),
            refused: Vec::new(),
        }
    }

    /// The door of an instance running `reconcile` for a plugin that declared `declared`.
    pub fn reporting(declared: std::sync::Arc<Declarations>) -> Self {
        MetricsDoor::Reporting {
            declared,
            report: MetricReport::default(),
        }
    }

    /// The `declare` import.
    pub fn declare(&mut self, metric: wit::Metric) -> Result<(), String> {
        let MetricsDoor::Declaring { declared, refused } = self else {
            return Err(
                "metrics are declared only while describe runs; declare them there".to_string(),
            );
        };
        let declaration = MetricDeclaration {
            name: metric.name,
            kind: match metric.kind {
                wit::MetricKind::Gauge => MetricKind::Gauge,
                wit::MetricKind::Counter => MetricKind::Counter,
            },
            help: metric.help,
            labels: metric.labels,
        };
        declared.declare(declaration).inspect_err(|why| {
            if refused.len() < MAX_METRICS_PER_PLUGIN {
                refused.push(why.clone());
            }
        })
    }

    /// The `set-gauge` and `add-counter` imports.
    pub fn report(
        &mut self,
        name: String,
        labels: Vec<(String, String)>,
        value: SampleValue,
    ) -> Result<(), String> {
        let MetricsDoor::Reporting { declared, report } = self else {
            return Err(
                "metrics are reported only while reconcile runs; this sample is dropped"
                    .to_string(),
            );
        };
        let kind = match value {
            SampleValue::Gauge(_) => MetricKind::Gauge,
            SampleValue::Counter(_) => MetricKind::Counter,
        };
        let checked = if report.samples.len() >= MAX_SAMPLES_PER_DECISION {
            Err(Refusal {
                reason: RefusalReason::TooManySamples,
                message: format!(
                    "more than {MAX_SAMPLES_PER_DECISION} samples in one decision; `{name}` is dropped"
                ),
            })
        } else if matches!(value, SampleValue::Gauge(v) if !v.is_finite()) {
            Err(Refusal {
                reason: RefusalReason::NotFinite,
                message: format!("gauge `{name}` was set to a value that is not finite"),
            })
        } else {
            declared.check(&name, kind, &labels)
        };
        match checked {
            Ok(label_values) => {
                report.samples.push(Sample {
                    name,
                    label_values,
                    value,
                });
                Ok(())
            }
            Err(refusal) => {
                let message = refusal.message.clone();
                // Bounded like the samples: a plugin looping on refused samples keeps one
                // decision's worth of reasons.
                if report.refused.len() < MAX_SAMPLES_PER_DECISION {
                    report.refused.push(refusal);
                }
                Err(message)
            }
        }
    }

    /// What the door holds, leaving it closed.
    pub fn take(&mut self) -> MetricsDoor {
        std::mem::take(self)
    }
}

impl wit::Host for super::Doors {
    async fn declare(&mut self, metric: wit::Metric) -> Result<(), String> {
        self.metrics_mut().declare(metric)
    }

    async fn set_gauge(
        &mut self,
        name: String,
        labels: Vec<(String, String)>,
        value: f64,
    ) -> Result<(), String> {
        self.metrics_mut()
            .report(name, labels, SampleValue::Gauge(value))
    }

    async fn add_counter(
        &mut self,
        name: String,
        labels: Vec<(String, String)>,
        delta: u64,
    ) -> Result<(), String> {
        self.metrics_mut()
            .report(name, labels, SampleValue::Counter(delta))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn metric(name: &str, kind: MetricKind, labels: &[&str]) -> MetricDeclaration {
        MetricDeclaration {
            name: name.into(),
            kind,
            help: "help".into(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
        }
    }

    /// Each row: a declaration after `members` (a gauge with label `role`) was declared, and
    /// whether it is accepted.
    #[test]
    fn declarations_keep_to_their_bounds() {
        let rows: Vec<(&str, MetricDeclaration, bool)> = vec![
            (
                "a counter with a label",
                metric("failovers", MetricKind::Counter, &["cause"]),
                true,
            ),
            (
                "a name declared twice",
                metric("members", MetricKind::Gauge, &[]),
                false,
            ),
            (
                "an upper-case name",
                metric("Members", MetricKind::Gauge, &[]),
                false,
            ),
            (
                "a name with a dash",
                metric("replica-lag", MetricKind::Gauge, &[]),
                false,
            ),
            (
                "a name starting with a digit",
                metric("9lives", MetricKind::Gauge, &[]),
                false,
            ),
            (
                "a counter named with _total",
                metric("failovers_total", MetricKind::Counter, &[]),
                false,
            ),
            (
                "a name too long",
                metric(&"a".repeat(MAX_NAME_BYTES + 1), MetricKind::Gauge, &[]),
                false,
            ),
            (
                "the host's namespace label",
                metric("lag", MetricKind::Gauge, &["namespace"]),
                false,
            ),
            (
                "a label twice",
                metric("lag", MetricKind::Gauge, &["replica", "replica"]),
                false,
            ),
            (
                "five labels",
                metric("lag", MetricKind::Gauge, &["a", "b", "c", "d", "e"]),
                false,
            ),
            (
                "a help of two lines",
                MetricDeclaration {
                    help: "one\ntwo".into(),
                    ..metric("lag", MetricKind::Gauge, &[])
                },
                false,
            ),
        ];
        for (situation, declaration, accepted) in rows {
            let mut declared = Declarations::default();
            declared
                .declare(metric("members", MetricKind::Gauge, &["role"]))
                .expect("the first declaration");
            let outcome = declared.declare(declaration);
            assert_eq!(outcome.is_ok(), accepted, "{situation}: {outcome:?}");
        }
    }

    #[test]
    fn a_plugin_declares_at_most_its_share_of_metrics() {
        let mut declared = Declarations::default();
        for n in 0..MAX_METRICS_PER_PLUGIN {
            declared
                .declare(metric(&format!("m{n}"), MetricKind::Gauge, &[]))
                .expect("within the bound");
        }
        let past = declared.declare(metric("one_more", MetricKind::Gauge, &[]));
        assert!(
            past.as_ref()
                .is_err_and(|e| e.contains(&MAX_METRICS_PER_PLUGIN.to_string())),
            "{past:?}"
        );
    }

    fn reporting() -> MetricsDoor {
        let mut declared = Declarations::default();
        declared
            .declare(metric("members", MetricKind::Gauge, &["role"]))
            .expect("declared");
        declared
            .declare(metric("failovers", MetricKind::Counter, &[]))
            .expect("declared");
        MetricsDoor::reporting(Arc::new(declared))
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A situation, the metric, its labels, its value, and the reason it is refused (none:
    /// accepted).
    type SampleRow = (
        &'static str,
        &'static str,
        Vec<(String, String)>,
        SampleValue,
        Option<RefusalReason>,
    );

    /// Each row: one sample reported while reconciling, and the reason it is refused (none:
    /// accepted).
    #[test]
    fn samples_are_held_to_what_was_declared() {
        let rows: Vec<SampleRow> = vec![
            (
                "a declared gauge with its label",
                "members",
                labels(&[("role", "voter")]),
                SampleValue::Gauge(3.0),
                None,
            ),
            (
                "a declared counter",
                "failovers",
                labels(&[]),
                SampleValue::Counter(1),
                None,
            ),
            (
                "an undeclared name",
                "leaders",
                labels(&[]),
                SampleValue::Gauge(1.0),
                Some(RefusalReason::Undeclared),
            ),
            (
                "an undeclared label",
                "members",
                labels(&[("role", "voter"), ("zone", "a")]),
                SampleValue::Gauge(3.0),
                Some(RefusalReason::UndeclaredLabel),
            ),
            (
                "a declared label left out",
                "members",
                labels(&[]),
                SampleValue::Gauge(3.0),
                Some(RefusalReason::UndeclaredLabel),
            ),
            (
                "a label given twice",
                "members",
                labels(&[("role", "voter"), ("role", "learner")]),
                SampleValue::Gauge(3.0),
                Some(RefusalReason::UndeclaredLabel),
            ),
            (
                "a counter set as a gauge",
                "failovers",
                labels(&[]),
                SampleValue::Gauge(1.0),
                Some(RefusalReason::WrongKind),
            ),
            (
                "a gauge that is not a number",
                "members",
                labels(&[("role", "voter")]),
                SampleValue::Gauge(f64::NAN),
                Some(RefusalReason::NotFinite),
            ),
            (
                "a label value too long",
                "members",
                vec![("role".into(), "v".repeat(MAX_LABEL_VALUE_BYTES + 1))],
                SampleValue::Gauge(3.0),
                Some(RefusalReason::LabelValueTooLong),
            ),
        ];
        for (situation, name, labels, value, refused) in rows {
            let mut door = reporting();
            let outcome = door.report(name.into(), labels, value);
            let MetricsDoor::Reporting { report, .. } = door else {
                unreachable!("still reporting")
            };
            match refused {
                None => {
                    assert!(outcome.is_ok(), "{situation}: {outcome:?}");
                    assert_eq!(report.samples.len(), 1, "{situation}");
                }
                Some(reason) => {
                    assert!(outcome.is_err(), "{situation}");
                    assert!(report.samples.is_empty(), "{situation}");
                    assert_eq!(
                        report.refused.iter().map(|r| r.reason).collect::<Vec<_>>(),
                        [reason],
                        "{situation}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_decision_reports_a_bounded_number_of_samples() {
        let mut door = reporting();
        for _ in 0..MAX_SAMPLES_PER_DECISION * 4 {
            let _ = door.report("failovers".into(), Vec::new(), SampleValue::Counter(1));
        }
        let MetricsDoor::Reporting { report, .. } = door else {
            unreachable!("still reporting")
        };
        assert_eq!(report.samples.len(), MAX_SAMPLES_PER_DECISION);
        assert_eq!(report.refused.len(), MAX_SAMPLES_PER_DECISION);
        assert!(
            report
                .refused
                .iter()
                .all(|r| r.reason == RefusalReason::TooManySamples)
        );
    }

    #[test]
    fn declaring_and_reporting_each_have_their_time() {
        let mut describing = MetricsDoor::declaring();
        assert!(
            describing
                .report("members".into(), Vec::new(), SampleValue::Gauge(1.0))
                .is_err(),
            "no sample while describe runs"
        );
        let mut deciding = reporting();
        let late = deciding.declare(wit::Metric {
            name: "late".into(),
            kind: wit::MetricKind::Gauge,
            help: String::new(),
            labels: Vec::new(),
        });
        assert!(late.is_err(), "no declaration while reconcile runs");
        let mut finalizing = MetricsDoor::Closed;
        assert!(
            finalizing
                .report("failovers".into(), Vec::new(), SampleValue::Counter(1))
                .is_err()
        );
    }
}
