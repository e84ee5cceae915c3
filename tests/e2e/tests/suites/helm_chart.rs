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
    helm_template_in(helm, "policy-host", extra)
}

/// `helm template policy-host deploy/chart --namespace <namespace>` with `extra` arguments.
fn helm_template_in(helm: &Path, namespace: &str, extra: &[&str]) -> anyhow::Result<Vec<Value>> {
    let output = Command::new(helm)
        .current_dir(repo_root())
        .args([
            "template",
            "policy-host",
            "deploy/chart",
            "--namespace",
            namespace,
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
    let trusted = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"].as_str() == Some("POLICY_HOST_TRUSTED_KEYS"))
        .expect("the trusted keys in the pod spec");
    assert_eq!(trusted["value"].as_str(), Some(public.trim()));
    assert!(
        find(&objects, "ConfigMap", "policy-host-trusted-keys").is_none(),
        "no ConfigMap holds the trusted keys"
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

/// Review L7: with leader election off every replica leads, so the chart runs one, whatever
/// `replicas` says.
#[test]
fn the_chart_without_leader_election_renders_one_replica() -> anyhow::Result<()> {
    init_logging();
    let helm = helm()?;
    for extra in [
        &["--set", "leaderElection.enabled=false"][..],
        &[
            "--set",
            "leaderElection.enabled=false",
            "--set",
            "replicas=3",
        ][..],
    ] {
        let objects = helm_template(&helm, extra)?;
        let deployment = find(&objects, "Deployment", "policy-host").expect("the Deployment");
        assert_eq!(
            deployment["spec"]["replicas"].as_u64(),
            Some(1),
            "{extra:?}: two hosts would lead"
        );
        assert!(
            find(&objects, "PodDisruptionBudget", "policy-host").is_none(),
            "{extra:?}: a budget for one replica only blocks drains"
        );
    }
    Ok(())
}

/// Review L7 and issue 24: the leader and its standby are kept apart (a spread over nodes) and
/// never both evicted at once (a budget), in the chart and in deploy/ alike (the defaults test
/// keeps them equal).
#[test]
fn the_host_replicas_have_a_disruption_budget_and_a_spread_over_nodes() -> anyhow::Result<()> {
    init_logging();
    let objects = helm_template(&helm()?, &[])?;
    let selector = serde_yaml::to_value(serde_json::json!({
        "matchLabels": { "app.kubernetes.io/name": "policy-host" }
    }))?;
    let budget =
        find(&objects, "PodDisruptionBudget", "policy-host").expect("a PodDisruptionBudget");
    assert_eq!(
        budget["metadata"]["namespace"].as_str(),
        Some("policy-host")
    );
    assert_eq!(budget["spec"]["selector"], selector);
    assert_eq!(
        budget["spec"]["maxUnavailable"].as_u64(),
        Some(1),
        "one host at a time: the other leads or takes over"
    );
    let deployment = find(&objects, "Deployment", "policy-host").expect("the Deployment");
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(2));
    let spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        .as_sequence()
        .expect("a topology spread constraint");
    assert!(
        spread.iter().any(|c| {
            c["topologyKey"].as_str() == Some("kubernetes.io/hostname")
                && c["maxSkew"].as_u64() == Some(1)
                && c["labelSelector"] == selector
        }),
        "the replicas spread over nodes: {spread:?}"
    );
    Ok(())
}

/// An object the rendered host reads the keys it trusts from: changing it changes what loads.
#[derive(Debug)]
struct TrustAnchor {
    resource: kube::api::ApiResource,
    name: String,
}

/// Where the rendered Deployment's host takes its trusted keys from: the key files named by
/// `--trusted-key` (the ConfigMap or Secret mounted there), the `POLICY_HOST_TRUSTED_KEYS`
/// variable (the Deployment itself when written inline, else the object it refers to).
fn trust_anchors(deployment: &Value) -> Vec<TrustAnchor> {
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let config_map = || kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let secret = || kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    let mut anchors = Vec::new();
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let files = args.iter().enumerate().filter_map(|(i, arg)| {
        arg.strip_prefix("--trusted-key=")
            .or_else(|| (*arg == "--trusted-key").then(|| args.get(i + 1).copied())?)
    });
    for file in files {
        let mounts = container["volumeMounts"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        let Some(mount) = mounts.iter().find(|m| {
            m["mountPath"]
                .as_str()
                .is_some_and(|path| file.starts_with(path))
        }) else {
            continue;
        };
        let volumes = pod["volumes"].as_sequence().cloned().unwrap_or_default();
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]);
        if let Some(name) = volume.and_then(|v| v["configMap"]["name"].as_str()) {
            anchors.push(TrustAnchor {
                resource: config_map(),
                name: name.to_owned(),
            });
        }
        if let Some(name) = volume.and_then(|v| v["secret"]["secretName"].as_str()) {
            anchors.push(TrustAnchor {
                resource: secret(),
                name: name.to_owned(),
            });
        }
    }
    let env = container["env"].as_sequence().cloned().unwrap_or_default();
    for variable in env
        .iter()
        .filter(|e| e["name"] == "POLICY_HOST_TRUSTED_KEYS")
    {
        if variable["value"].is_string() {
            anchors.push(TrustAnchor {
                resource: kube::api::ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(
                    &(),
                ),
                name: deployment["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            });
        }
        let from = &variable["valueFrom"];
        if let Some(name) = from["configMapKeyRef"]["name"].as_str() {
            anchors.push(TrustAnchor {
                resource: config_map(),
                name: name.to_owned(),
            });
        }
        if let Some(name) = from["secretKeyRef"]["name"].as_str() {
            anchors.push(TrustAnchor {
                resource: secret(),
                name: name.to_owned(),
            });
        }
    }
    anchors
}

/// A client acting as `user` in `groups`, with exactly the rights RBAC gives them.
async fn acting_as(
    env: &policy_host_testenv::TestEnv,
    user: &str,
    groups: Vec<String>,
) -> anyhow::Result<kube::Client> {
    let mut config = env.kube_config().await?;
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(groups);
    Ok(kube::Client::try_from(config)?)
}

/// Review H2: the keys the host trusts sat in a ConfigMap of the plugin namespace, so whoever
/// may write plugin ConfigMaps (the principal signatures guard against) could put their own
/// key there, and the host's own ConfigMap `patch` reached it too. With the chart's defaults
/// and `trustedKeys`, neither a plugin-ConfigMap writer nor the host's ServiceAccount (each
/// with its real RBAC, impersonated) may change, delete or recreate what the host trusts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_chart_trusts_is_out_of_reach_of_plugin_config_map_writers() -> anyhow::Result<()>
{
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};

    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    let helm = tokio::task::spawn_blocking(helm).await??;
    let namespace = env.create_namespace("chart-trust").await?;
    let keys = tempfile::tempdir()?;
    let key = keygen(&keys.path().join("platform-team"))?;
    let values = keys.path().join("values.yaml");
    std::fs::write(
        &values,
        serde_yaml::to_string(&serde_json::json!({
            "trustedKeys": { "platform-team.pub": std::fs::read_to_string(&key.public)? },
        }))?,
    )?;
    let values_arg = values.display().to_string();
    let objects = helm_template_in(&helm, &namespace, &["--values", &values_arg])?;
    let deployment = find(&objects, "Deployment", "policy-host").expect("the Deployment");
    let anchors = trust_anchors(deployment);
    assert!(
        !anchors.is_empty(),
        "the chart gives the host no trusted key: {deployment:?}"
    );

    // The host's namespaced rights as the chart renders them (its plugin namespace is the
    // release namespace by default), and a plugin author who may write ConfigMaps there.
    for object in &objects {
        let in_namespace = object["metadata"]["namespace"].as_str() == Some(&*namespace);
        let params = PatchParams::apply("e2e").force();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        match object["kind"].as_str() {
            Some("ServiceAccount") if in_namespace => {
                let typed: ServiceAccount = serde_yaml::from_value(object.clone())?;
                Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
                    .patch(name, &params, &Patch::Apply(&typed))
                    .await?;
            }
            Some("Role") if in_namespace => {
                let typed: Role = serde_yaml::from_value(object.clone())?;
                Api::<Role>::namespaced(client.clone(), &namespace)
                    .patch(name, &params, &Patch::Apply(&typed))
                    .await?;
            }
            Some("RoleBinding") if in_namespace => {
                let typed: RoleBinding = serde_yaml::from_value(object.clone())?;
                Api::<RoleBinding>::namespaced(client.clone(), &namespace)
                    .patch(name, &params, &Patch::Apply(&typed))
                    .await?;
            }
            _ => {}
        }
    }
    let author_role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "plugin-author" },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"] }],
    }))?;
    Api::<Role>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &author_role)
        .await?;
    let author_binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "plugin-author" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "plugin-author" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "plugin-author" }],
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &author_binding)
        .await?;
    let principals = [
        (
            "a plugin-ConfigMap writer",
            acting_as(env, "plugin-author", vec!["system:authenticated".into()]).await?,
        ),
        (
            "the host's ServiceAccount",
            acting_as(
                env,
                &format!("system:serviceaccount:{namespace}:policy-host"),
                vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{namespace}"),
                    "system:authenticated".into(),
                ],
            )
            .await?,
        ),
    ];
    // RBAC answers before existence: 403 is refused, anything else (404 included) allowed.
    let refused = |result: Result<(), kube::Error>| matches!(result, Err(kube::Error::Api(status)) if status.code == 403);
    let mut reachable = Vec::new();
    for (who, as_them) in &principals {
        // The plugin author's Role binds once the RBAC cache has it: wait for its own right.
        let own: Api<DynamicObject> = Api::namespaced_with(
            as_them.clone(),
            &namespace,
            &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        policy_host_testenv::wait_for(
            &format!("{who}'s rights in force"),
            std::time::Duration::from_secs(30),
            || async { own.list(&Default::default()).await.ok() },
        )
        .await?;
        for anchor in &anchors {
            let api: Api<DynamicObject> =
                Api::namespaced_with(as_them.clone(), &namespace, &anchor.resource);
            let dry_patch = PatchParams {
                dry_run: true,
                ..PatchParams::default()
            };
            let change = Patch::Merge(serde_json::json!({
                "metadata": { "annotations": { "e2e/changed": "true" } }
            }));
            if !refused(api.patch(&anchor.name, &dry_patch, &change).await.map(drop)) {
                reachable.push(format!("{who} may patch {anchor:?}"));
            }
            let dry_delete = DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            };
            if !refused(api.delete(&anchor.name, &dry_delete).await.map(drop)) {
                reachable.push(format!("{who} may delete {anchor:?}"));
            }
            let mut recreated = DynamicObject::new(&anchor.name, &anchor.resource);
            recreated.metadata.namespace = Some(namespace.to_string());
            let dry_create = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            if !refused(api.create(&dry_create, &recreated).await.map(drop)) {
                reachable.push(format!("{who} may create {anchor:?}"));
            }
        }
    }
    assert!(
        reachable.is_empty(),
        "what the host trusts is within reach of those it guards against: {reachable:#?}"
    );
    Ok(())
}
