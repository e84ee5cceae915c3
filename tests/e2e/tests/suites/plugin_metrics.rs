//! Domain metrics of a plugin on the host's `/metrics`, against the real API server: a decision's
//! gauges and counters appear per parent, labelled with the parent's namespace and name; a
//! gauge the next decision leaves out goes; a name or label the plugin did not declare is refused
//! (the plugin is told, the host counts it, nothing is exported); one parent's label values are
//! capped; and a deleted parent's series go.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host::load::pack::{self, PackOptions};
use policy_host::metrics::plugin::MAX_SERIES_PER_METRIC_PER_PARENT;
use policy_host_e2e::{
    HostUnderTest, init_logging, install_crd_object, plugins, probe_crd, probes,
};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const MANAGER: &str = "plugin-metrics-e2e";

async fn apply_probe(api: &Api<DynamicObject>, name: &str, spec: Value) -> anyhow::Result<()> {
    let mut spec = spec;
    spec["behaviour"] = json!("metrics");
    let object = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name }, "spec": spec
    });
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

async fn scrape(admin: std::net::SocketAddr) -> Option<String> {
    policy_host::capability::http::http_client()
        .ok()?
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// The host's /metrics once `holds` says it shows what is awaited.
async fn metrics_where(
    admin: std::net::SocketAddr,
    what: &str,
    holds: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    Ok(wait_for(what, WAIT, || async {
        let text = scrape(admin).await?;
        holds(&text).then_some(text)
    })
    .await?)
}

/// The sample lines of `metric` for the parent `name`.
fn series<'a>(text: &'a str, metric: &str, namespace: &str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{metric}{{namespace=\"{namespace}\",name=\"{name}\"");
    text.lines().filter(|l| l.starts_with(&prefix)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_metrics_are_exported_per_parent_within_their_bounds() -> anyhow::Result<()> {
    init_logging();
    let component = std::fs::read(
        policy_host_test_plugins::build_version("1.0.0").map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("plugin-metrics").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    let ns: &str = &namespace;

    let outcome = async {
        let admin = host
            .running
            .admin_addr
            .ok_or_else(|| anyhow::anyhow!("the host serves no admin endpoint"))?;
        let cm = pack::to_config_map(
            &component,
            &PackOptions {
                name: "plugin-metrics".into(),
                ..Default::default()
            },
        )?;
        plugins::apply_pack(&config_maps, cm, MANAGER).await?;
        wait_for("the host to load the plugin", WAIT, || async {
            (!host.running.store.list().is_empty()).then_some(())
        })
        .await?;

        // A decision's gauges and counter, per parent, with the parent's namespace and name.
        apply_probe(&api, "db", json!({ "replicas": ["db-0", "db-1"], "lag": 2.5 })).await?;
        let lag = "policy_host_plugin_misbehaving_lag_seconds";
        let decisions = "policy_host_plugin_misbehaving_decisions_total";
        let text = metrics_where(admin, "db's metrics", |text| {
            series(text, lag, ns, "db").len() == 2 && !series(text, decisions, ns, "db").is_empty()
        })
        .await?;
        anyhow::ensure!(
            text.contains(&format!(
                "{lag}{{namespace=\"{ns}\",name=\"db\",replica=\"db-1\"}} 2.5"
            )),
            "the gauge with its labels and value:\n{text}"
        );
        anyhow::ensure!(
            text.contains("# TYPE policy_host_plugin_misbehaving_decisions counter"),
            "the counter's type:\n{text}"
        );

        // The next decision leaves db-1 out: its gauge goes; the counter counts on.
        apply_probe(&api, "db", json!({ "replicas": ["db-0"], "lag": 2.5 })).await?;
        metrics_where(admin, "db-1's gauge to go", |text| {
            series(text, lag, ns, "db").len() == 1
        })
        .await?;

        // Undeclared: a name and a label the plugin did not declare are refused, the plugin is
        // told, the host counts them, and nothing of them is exported.
        apply_probe(&api, "stray", json!({ "replicas": [], "undeclared": true })).await?;
        let said = wait_for("stray's metric answers", WAIT, || async {
            let object = api.get("stray").await.ok()?;
            let said = object.data["status"]["metrics"].as_array()?.clone();
            (said.len() == 3).then_some(said)
        })
        .await?;
        anyhow::ensure!(said[0] == json!("ok"), "the declared counter: {said:?}");
        for refused in &said[1..] {
            anyhow::ensure!(
                refused.as_str().is_some_and(|s| s.starts_with("refused:")),
                "an undeclared sample was accepted: {said:?}"
            );
        }
        let text = metrics_where(admin, "the refusals counted", |text| {
            text.contains(
                "policy_host_metric_samples_refused_total{policy=\"misbehaving\",reason=\"Undeclared\"}",
            ) && text.contains(
                "policy_host_metric_samples_refused_total{policy=\"misbehaving\",reason=\"UndeclaredLabel\"}",
            )
        })
        .await?;
        anyhow::ensure!(
            !text.contains("undeclared_metric") && !text.contains("zone="),
            "an undeclared name or label was exported:\n{text}"
        );

        // Cardinality: one parent's label values of one metric are capped.
        let many: Vec<String> = (0..MAX_SERIES_PER_METRIC_PER_PARENT + 8)
            .map(|n| format!("wide-{n}"))
            .collect();
        apply_probe(&api, "wide", json!({ "replicas": many })).await?;
        let text = metrics_where(admin, "wide's capped series", |text| {
            !series(text, lag, ns, "wide").is_empty()
                && text.contains(
                    "policy_host_metric_samples_refused_total{policy=\"misbehaving\",reason=\"SeriesPerParentCap\"}",
                )
        })
        .await?;
        let exported = series(&text, lag, ns, "wide").len();
        anyhow::ensure!(
            exported == MAX_SERIES_PER_METRIC_PER_PARENT,
            "{exported} series of one parent's metric, the cap is {MAX_SERIES_PER_METRIC_PER_PARENT}"
        );

        // A deleted parent's series go; the others stay.
        api.delete("db", &DeleteParams::default()).await?;
        let text = metrics_where(admin, "db's series to go", |text| {
            series(text, lag, ns, "db").is_empty() && series(text, decisions, ns, "db").is_empty()
        })
        .await?;
        anyhow::ensure!(
            !series(&text, lag, ns, "wide").is_empty(),
            "another parent's series went too:\n{text}"
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    host.stop().await;
    outcome
}
