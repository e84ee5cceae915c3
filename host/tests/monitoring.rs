//! The alerts and the dashboard of `deploy/monitoring/` name only metrics that exist: every
//! metric in a rule's `expr` and in a dashboard query is one the host registers (its families,
//! as rendered, with `_total` on counters and `_bucket`/`_sum`/`_count` on histograms) or one a
//! plugin of `policies/` declares (loaded the way the host loads its ConfigMap, and named the
//! way the host exports it). A misspelled name fails here, not silently on a dashboard.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use policy_host::capability::metrics::{
    Declarations, MetricKind, MetricReport, Refusal, RefusalReason,
};
use policy_host::decide::{Limits, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::pack::{PackDefaults, PluginPack};
use policy_host::metrics::Metrics;
use policy_host::metrics::plugin::exported_name;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// The sample names of every family the host registers: each family is touched once so that
/// it renders, then read from its `# TYPE` line.
fn host_metric_names() -> BTreeSet<String> {
    let metrics = Metrics::new();
    metrics.reconcile_started("p");
    metrics.reconcile_failed("p", "R");
    metrics.reconcile_deferred("p");
    metrics.reconcile_abandoned("p");
    metrics.decision_took("p", Duration::from_millis(1));
    metrics.plugin_load("s", "Loaded");
    metrics.controller_running("p", true);
    metrics.controller_restarted("p");
    metrics.shadow_compared("p", "p@2", "same");
    metrics.cache_held("p", "parents", 1, 1);
    metrics.cache_ignored("p", "pods");
    metrics.bound_reached("b", "test");
    metrics.child_applies("p", 1, 1);
    metrics.plugin_reported(
        "p",
        ("ns", "n"),
        &Arc::new(Declarations::default()),
        &MetricReport {
            samples: Vec::new(),
            refused: vec![Refusal {
                reason: RefusalReason::Undeclared,
                message: "test".into(),
            }],
        },
        true,
    );
    let text = metrics.render();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    assert!(
        names.len() >= 14,
        "every host family rendered: {names:?}\n{text}"
    );
    names
}

/// The sample names of every metric the plugins of policies/ declare.
async fn plugin_metric_names() -> BTreeSet<String> {
    let loader = PluginLoader::new(Sandbox::new().expect("sandbox"), None);
    let defaults = PackDefaults {
        limits: Limits::default(),
        concurrency: 1,
    };
    let mut names = BTreeSet::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(repo_root().join("policies"))
        .expect("policies/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).expect("bundle readable");
        for document in serde_yaml::Deserializer::from_str(&text) {
            let object: serde_yaml::Value =
                serde::Deserialize::deserialize(document).expect("a YAML document");
            if object["kind"].as_str() != Some("ConfigMap") {
                continue;
            }
            let config_map: ConfigMap = serde_yaml::from_value(object).expect("a ConfigMap");
            let pack = PluginPack::from_config_map(&config_map, &defaults).expect("pack decodes");
            let (plugin, _) = loader
                .load(
                    &path.display().to_string(),
                    &pack.component,
                    &pack.sha256,
                    pack.limits,
                )
                .await
                .expect("pack loads");
            for declared in plugin.declared_metrics().iter() {
                let name = format!(
                    "policy_host_{}",
                    exported_name(&plugin.info().name, &declared.name)
                );
                names.insert(match declared.kind {
                    MetricKind::Gauge => name,
                    MetricKind::Counter => format!("{name}_total"),
                });
            }
        }
    }
    names
}

/// Words of PromQL that are no metric names: keywords, and the aggregation operators (which
/// may stand before `by (...)` rather than a parenthesis).
const PROMQL_WORDS: &[&str] = &[
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "limitk",
    "limit_ratio",
];

/// Clauses whose parenthesis holds label names.
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Index just past what opens at `i` and closes with `close`, skipping quoted strings.
fn skip_past(chars: &[char], mut i: usize, close: char) -> usize {
    let in_string = matches!(close, '"' | '\'' | '`');
    i += 1;
    while i < chars.len() && chars[i] != close {
        if !in_string && matches!(chars[i], '"' | '\'' | '`') {
            i = skip_past(chars, i, chars[i]) - 1;
        } else if chars[i] == '\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The metric names a PromQL expression (or a Grafana query) selects: identifiers outside
/// label matchers, strings, ranges and grouping clauses that are not functions, keywords,
/// numbers or Grafana variables.
fn metric_names_in(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            i = skip_past(&chars, i, '}');
        } else if c == '[' {
            i = skip_past(&chars, i, ']');
        } else if matches!(c, '"' | '\'' | '`') {
            i = skip_past(&chars, i, c);
        } else if c == '$' || c.is_ascii_digit() || c == '.' {
            // A Grafana variable, or a number or duration.
            i += 1;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let opens = chars.get(next) == Some(&'(');
            if GROUPING.contains(&word.as_str()) {
                if opens {
                    i = skip_past(&chars, next, ')');
                }
            } else if !opens && !PROMQL_WORDS.contains(&word.to_lowercase().as_str()) {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every query of the dashboard: panel targets (rows included) and variable queries.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    fn panels(list: &serde_json::Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(expr.to_string());
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let mut queries = Vec::new();
    panels(&dashboard["panels"], &mut queries);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(query) = variable["query"]["query"].as_str() {
            queries.push(query.to_string());
        }
    }
    queries
}

fn rule_expressions(rule_file: &serde_yaml::Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for group in rule_file["spec"]["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .expect("an alert or a record")
                .to_string();
            let expr = rule["expr"].as_str().expect("an expr").to_string();
            found.push((name, expr));
        }
    }
    found
}

#[test]
fn promql_names_are_found_and_functions_labels_and_variables_are_not() {
    let rows: Vec<(&str, Vec<&str>)> = vec![
        (
            "sum by (policy, reason) (rate(policy_host_reconcile_errors_total{reason=~\"Plugin.*\"}[10m])) > 0",
            vec!["policy_host_reconcile_errors_total"],
        ),
        (
            "histogram_quantile(0.99, sum by (policy, le) (rate(policy_host_decision_duration_seconds_bucket[$__rate_interval])))",
            vec!["policy_host_decision_duration_seconds_bucket"],
        ),
        (
            "time() - policy_host_plugin_etcd_backup_last_success_timestamp_seconds > 2 * 86400",
            vec!["policy_host_plugin_etcd_backup_last_success_timestamp_seconds"],
        ),
        (
            "a_ready < a_desired or increase(b_total{outcome=\"failed\"}[1h]) > 1",
            vec!["a_ready", "a_desired", "b_total"],
        ),
        (
            "label_values({__name__=~\"policy_host_plugin_.+\", namespace=~\"$namespace\"}, name)",
            vec!["name"],
        ),
    ];
    for (expr, expected) in rows {
        assert_eq!(metric_names_in(expr), expected, "{expr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_and_the_dashboard_use_is_exported() {
    let mut exported = host_metric_names();
    let from_plugins = plugin_metric_names().await;
    for expected in [
        "policy_host_plugin_etcd_members_ready",
        "policy_host_plugin_mariadb_failovers_total",
    ] {
        assert!(
            from_plugins.contains(expected),
            "the plugins of policies/ declare {expected}: {from_plugins:?}"
        );
    }
    exported.extend(from_plugins);

    let monitoring = repo_root().join("deploy/monitoring");
    let rules: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(monitoring.join("prometheus-rule.yaml")).expect("rules"),
    )
    .expect("rules are YAML");
    assert_eq!(rules["kind"].as_str(), Some("PrometheusRule"));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring.join("grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");

    let mut checked = Vec::new();
    for (alert, expr) in rule_expressions(&rules) {
        checked.push((format!("alert {alert}"), expr));
    }
    for query in dashboard_queries(&dashboard) {
        checked.push(("the dashboard".to_string(), query));
    }
    assert!(checked.len() > 20, "{checked:?}");
    let mut unknown = Vec::new();
    for (place, expr) in &checked {
        // A variable query's last argument is a label name, not a metric.
        let names = metric_names_in(expr);
        let names = if expr.starts_with("label_values(") {
            &names[..names.len().saturating_sub(1)]
        } else {
            &names[..]
        };
        for name in names {
            if !exported.contains(name) {
                unknown.push(format!("{place}: {name} in {expr}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics nobody exports:\n{}\n(exported: {exported:?})",
        unknown.join("\n")
    );
    // Every alert and every panel selects a metric: an expression the scanner misread to
    // nothing would pass the check above without checking anything.
    for (place, expr) in &checked {
        if !expr.starts_with("label_values(") {
            assert!(!metric_names_in(expr).is_empty(), "{place}: {expr}");
        }
    }
}

#[test]
fn a_misspelled_metric_is_caught() {
    let exported = host_metric_names();
    let names = metric_names_in("rate(policy_host_reconcile_eror_total[5m])");
    assert_eq!(names, ["policy_host_reconcile_eror_total"]);
    assert!(!exported.contains(&names[0]));
}
