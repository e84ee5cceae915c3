//! The Helm chart (`deploy/chart/`), rendered by the real `helm` (built from its Go module by
//! the test environment): with its defaults it renders exactly the objects of
//! `deploy/rbac.yaml` and `deploy/deployment.yaml` (the install suite runs those on the real
//! node, so the chart cannot drift from what is tested), and with every option set it renders
//! objects the real kube-apiserver accepts (a server-side dry run), wired the way the options
//! say.
//!
//! Why the real `helm` and not a renderer of our own: the chart uses Go templates and Sprig
//! (`toYaml`, `nindent`, `default`), and only helm renders them the way users' helm will.

use std::path::Path;
use std::process::Command;

use policy_host::plugin_cli::keygen::keygen;
use policy_host_e2e::{init_logging, repo_root};
use policy_host_testenv::shared_node;
use serde::Deserialize;
use serde_yaml::Value;

/// `helm template policy-host deploy/chart --namespace policy-host` with `extra` arguments.
fn helm_template(helm: &Path, extra: &[&str]) -> anyhow::Result<Vec<Value>> {
    let output = Command::new(helm)
        .current_dir(repo_root())
        .args([
            "template",
            "policy-host",
            "deploy/chart",
            "--namespace",
            "policy-host",
        ])
        .args(extra)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse(&String::from_utf8(output.stdout)?)
}

fn parse(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(document)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// (kind, namespace, name) of an object, to pair rendered and written objects.
fn key(object: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

fn sorted(mut objects: Vec<Value>) -> Vec<Value> {
    objects.sort_by_key(key);
    objects
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
}

fn helm() -> anyhow::Result<std::path::PathBuf> {
    let binaries = policy_host_testenv::binaries::Binaries::ensure()?;
    Ok(binaries.ensure_helm()?)
}

#[test]
fn the_chart_renders_the_deploy_manifests_for_its_defaults() -> anyhow::Result<()> {
    init_logging();
    let rendered = sorted(helm_template(&helm()?, &[])?);
    let mut written = Vec::new();
    for file in ["deploy/rbac.yaml", "deploy/deployment.yaml"] {
        written.extend(parse(&std::fs::read_to_string(repo_root().join(file))?)?);
    }
    // The Namespace is `helm install --create-namespace`'s to make: a chart that templated it
    // could not be installed into it.
    let written = sorted(
        written
            .into_iter()
            .filter(|o| o["kind"].as_str() != Some("Namespace"))
            .collect(),
    );
    let names = |objects: &[Value]| objects.iter().map(key).collect::<Vec<_>>();
    assert_eq!(
        names(&rendered),
        names(&written),
        "the chart renders the objects of deploy/rbac.yaml and deploy/deployment.yaml"
    );
    for (rendered, written) in rendered.iter().zip(&written) {
        assert_eq!(
            rendered,
            written,
            "{:?}: the chart's defaults render what deploy/ says; change both together",
            key(written)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_with_every_option_set_is_accepted_by_the_api_server() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let helm = tokio::task::spawn_blocking(helm).await??;
    let keys = tempfile::tempdir()?;
    let key = keygen(&keys.path().join("platform-team"))?;
    let values = keys.path().join("values.yaml");
    let public = std::fs::read_to_string(&key.public)?;
    std::fs::write(
        &values,
        serde_yaml::to_string(&serde_json::json!({
            "replicas": 1,
            "image": { "repository": "registry.example/policy-host", "tag": "0.2.0" },
            "resources": { "limits": { "memory": "2Gi" } },
            "logFormat": "text",
            "pluginNamespace": "chart-plugins",
            "trustedKeys": { "platform-team.pub": public },
            "leaderElection": { "enabled": false },
            "artifactCache": { "sizeLimit": "1Gi" },
        }))?,
    )?;
    let values_arg = values.display().to_string();
    let objects = helm_template(&helm, &["--values", &values_arg])?;

    let deployment = find(&objects, "Deployment", "policy-host").expect("the Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let joined = args.join(" ");
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(1));
    assert_eq!(
        container["image"].as_str(),
        Some("registry.example/policy-host:0.2.0")
    );
    assert_eq!(
        container["resources"]["limits"]["memory"].as_str(),
        Some("2Gi")
    );
    assert_eq!(container["env"][0]["value"].as_str(), Some("text"));
    assert!(
        joined.contains("--plugin-namespace chart-plugins"),
        "{joined}"
    );
    assert!(joined.contains("--leader-election false"), "{joined}");
    assert!(!joined.contains("--lease-name"), "{joined}");
    assert!(
        joined.contains("--trusted-key /etc/policy-host/trusted-keys/platform-team.pub"),
        "{joined}"
    );
    let keys_config_map =
        find(&objects, "ConfigMap", "policy-host-trusted-keys").expect("the trusted keys");
    assert_eq!(
        keys_config_map["data"]["platform-team.pub"].as_str(),
        Some(public.as_str())
    );
    assert_eq!(
        pod["volumes"][1]["configMap"]["name"].as_str(),
        Some("policy-host-trusted-keys")
    );
    let plugins_role = find(&objects, "Role", "policy-host-plugins").expect("the plugins Role");
    assert_eq!(
        plugins_role["metadata"]["namespace"].as_str(),
        Some("chart-plugins")
    );
    assert!(
        find(&objects, "Role", "policy-host-leader-election").is_none(),
        "no Lease rights without leader election"
    );

    // The real API server accepts every rendered object (a server-side dry run validates each
    // against its schema, admission included, and writes nothing).
    for namespace in ["policy-host", "chart-plugins"] {
        let _ = policy_host_testenv::install::run_kubectl(
            &repo_root(),
            &env.binaries().kubectl(),
            env.kubeconfig_path(),
            &["create", "namespace", namespace],
        );
    }
    let rendered = keys.path().join("rendered.yaml");
    let mut text = String::new();
    for object in &objects {
        text.push_str("---\n");
        text.push_str(&serde_yaml::to_string(object)?);
    }
    std::fs::write(&rendered, text)?;
    let out = policy_host_testenv::install::run_kubectl(
        &repo_root(),
        &env.binaries().kubectl(),
        env.kubeconfig_path(),
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-f",
            &rendered.display().to_string(),
        ],
    )?;
    assert_eq!(
        out.lines().count(),
        objects.len(),
        "every rendered object accepted: {out}"
    );
    Ok(())
}
