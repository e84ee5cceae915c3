//! `kubectl policy-host`: what an admin asks of a parent and of the loaded plugins from the
//! command line, for any plugin's kind — a parent's conditions and the Pods it controls,
//! pause and resume, a backup or a switchover now, the loaded plugins with their grants, and
//! the decision the loaded plugin would make on the live parent's observation, without acting.
//!
//! Every command is a function of the API server's answers and returns the text to print, so
//! the tests run them against a real API server in-process; the `kubectl-policy_host` binary
//! is the thin edge that parses arguments and prints. App-specific commands ask nothing of
//! the plugin: they write the field or annotation its CRD documents (`spec.paused`,
//! `spec.trigger` or `spec.backup.trigger`, `<group>/switchover-to`) and refuse a kind whose
//! schema has no such field, saying which.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{ApiResource, Discovery};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::capability::replay::AppCallScript;
use crate::capability::scope::AppCallScope;
use crate::contract::{Action, Child, EventType, KindRef, Observation, Timestamp};
use crate::decide::{Limits, Sandbox};
use crate::load::pack::{PackDefaults, PluginPack};
use crate::load::status::STATUS_CONFIG_MAP;

/// The field manager of every write this tool makes.
pub const FIELD_MANAGER: &str = "kubectl-policy-host";

/// What went wrong, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum KubectlError {
    /// `KIND/NAME` was not written so.
    #[error("`{0}` is not KIND/NAME (e.g. etcdcluster/example)")]
    Target(String),
    /// No resource of the API server has that name.
    #[error(
        "the API server serves no kind `{0}`; name it by kind, plural or plural.group (`kubectl api-resources` lists them)"
    )]
    UnknownKind(String),
    /// The kind's schema has no field for what was asked.
    #[error(
        "{kind} has no {field} in its schema, so its plugin offers no {what}; kinds that do: {who}"
    )]
    NotOffered {
        /// The kind.
        kind: String,
        /// The field looked for.
        field: String,
        /// The command.
        what: String,
        /// Which shipped kinds offer it.
        who: String,
    },
    /// No loaded plugin reconciles the kind.
    #[error(
        "no plugin loaded by the host reconciles {0} (the status ConfigMap {STATUS_CONFIG_MAP} lists none); `kubectl policy-host plugins` shows what is loaded"
    )]
    NoPlugin(String),
    /// The plugin could not be read, loaded or run.
    #[error("{0}")]
    Plugin(String),
    /// The API server refused or failed.
    #[error("the API server: {0}")]
    Api(#[from] kube::Error),
}

/// A parent named on the command line.
#[derive(Clone, Debug)]
pub struct Target {
    /// Kind, plural or `plural.group`, as typed.
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

impl Target {
    /// Reads `KIND/NAME` in `namespace`.
    pub fn parse(text: &str, namespace: &str) -> Result<Self, KubectlError> {
        match text.split_once('/') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                    namespace: namespace.to_owned(),
                })
            }
            _ => Err(KubectlError::Target(text.to_owned())),
        }
    }
}

/// The resource the API server serves under `kind` (its kind, plural or `plural.group`, any
/// case); custom resources first when a name is ambiguous.
pub async fn resolve(client: &Client, kind: &str) -> Result<ApiResource, KubectlError> {
    let wanted = kind.to_ascii_lowercase();
    let discovery = Discovery::new(client.clone()).run().await?;
    discovery
        .groups()
        .flat_map(|group| group.recommended_resources())
        .map(|(resource, _)| resource)
        .filter(|resource| {
            resource.plural == wanted
                || resource.kind.to_ascii_lowercase() == wanted
                || format!("{}.{}", resource.plural, resource.group) == wanted
        })
        // A custom resource wins over a core kind of the same name.
        .min_by_key(|resource| resource.group.is_empty())
        .ok_or_else(|| KubectlError::UnknownKind(kind.to_owned()))
}

/// `status`: the parent's phase and conditions, and the Pods it controls.
pub async fn status(client: &Client, target: &Target) -> Result<String, KubectlError> {
    let resource = resolve(client, &target.kind).await?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &target.namespace, &resource);
    let parent = api.get(&target.name).await?;
    let status = &parent.data["status"];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {}/{}{}",
        resource.kind,
        target.namespace,
        target.name,
        status["phase"]
            .as_str()
            .map(|p| format!("  phase {p}"))
            .unwrap_or_default()
    );
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    if conditions.is_empty() {
        out.push_str("no conditions yet (the plugin has not written status, or writes none)\n");
    } else {
        let rows = conditions.iter().map(|c| {
            ["type", "status", "reason", "lastTransitionTime", "message"]
                .map(|field| c[field].as_str().unwrap_or("").to_owned())
                .to_vec()
        });
        out.push_str(&table(
            &["CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE"],
            rows,
        ));
    }
    let uid = parent.metadata.uid.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    let mut controlled: Vec<Pod> = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|pod| {
            pod.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.uid == uid)
        })
        .collect();
    controlled.sort_by_key(|pod| pod.name_any());
    if controlled.is_empty() {
        out.push_str("no Pods controlled by it\n");
    } else {
        let rows = controlled.iter().map(|pod| {
            let status = pod.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .map_or(
                    "false",
                    |c| if c.status == "True" { "true" } else { "false" },
                );
            let restarts: i32 = status
                .container_statuses
                .iter()
                .flatten()
                .map(|c| c.restart_count)
                .sum();
            let image = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            vec![
                pod.name_any(),
                status.phase.unwrap_or_default(),
                ready.to_owned(),
                restarts.to_string(),
                status.pod_ip.unwrap_or_default(),
                pod.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
                image,
            ]
        });
        out.push_str(&table(
            &["POD", "PHASE", "READY", "RESTARTS", "IP", "NODE", "IMAGE"],
            rows,
        ));
    }
    Ok(out)
}

/// The properties of `spec` in the schema `resource` is served with, if it is a custom
/// resource with a schema.
async fn spec_schema(client: &Client, resource: &ApiResource) -> Result<Value, KubectlError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let Some(crd) = crds
        .get_opt(&format!("{}.{}", resource.plural, resource.group))
        .await?
    else {
        return Ok(Value::Null);
    };
    let crd = serde_json::to_value(&crd).unwrap_or_default();
    let version = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == json!(resource.version))
        .cloned()
        .unwrap_or_default();
    Ok(version["schema"]["openAPIV3Schema"]["properties"]["spec"].clone())
}

/// True when `schema` (of `spec`) has the field at `path` below it.
fn has_field(schema: &Value, path: &[&str]) -> bool {
    let mut at = schema;
    for field in path {
        at = &at["properties"][*field];
        if at.is_null() {
            return false;
        }
    }
    true
}

async fn merge_patch(
    client: &Client,
    resource: &ApiResource,
    target: &Target,
    patch: Value,
) -> Result<(), KubectlError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &target.namespace, resource);
    api.patch(
        &target.name,
        &PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        },
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// `pause` / `resume`: sets `spec.paused`, where the kind's schema has it.
pub async fn pause(client: &Client, target: &Target, paused: bool) -> Result<String, KubectlError> {
    let resource = resolve(client, &target.kind).await?;
    if !has_field(&spec_schema(client, &resource).await?, &["paused"]) {
        return Err(KubectlError::NotOffered {
            kind: resource.kind,
            field: "spec.paused".into(),
            what: "pausing".into(),
            who: "EtcdCluster".into(),
        });
    }
    merge_patch(
        client,
        &resource,
        target,
        json!({ "spec": { "paused": paused } }),
    )
    .await?;
    Ok(format!(
        "{} {}/{} {}: its plugin {} acting on it\n",
        resource.kind,
        target.namespace,
        target.name,
        if paused { "paused" } else { "resumed" },
        if paused { "stops" } else { "resumes" }
    ))
}

/// `backup`: asks for a snapshot now, by setting the kind's trigger (`spec.trigger` of an
/// EtcdBackup, `spec.backup.trigger` of an EtcdCluster) to `now`.
pub async fn backup(client: &Client, target: &Target, now: &str) -> Result<String, KubectlError> {
    let resource = resolve(client, &target.kind).await?;
    let schema = spec_schema(client, &resource).await?;
    let patch = if has_field(&schema, &["trigger"]) {
        json!({ "spec": { "trigger": now } })
    } else if has_field(&schema, &["backup", "trigger"]) {
        json!({ "spec": { "backup": { "trigger": now } } })
    } else {
        return Err(KubectlError::NotOffered {
            kind: resource.kind,
            field: "spec.trigger or spec.backup.trigger".into(),
            what: "backup on demand".into(),
            who: "EtcdBackup, EtcdCluster (with spec.backup)".into(),
        });
    };
    merge_patch(client, &resource, target, patch).await?;
    Ok(format!(
        "asked {} {}/{} for a backup now (trigger {now}); its status records the snapshot\n",
        resource.kind, target.namespace, target.name
    ))
}

/// `switchover`: asks the plugin to make `to` the primary, with the annotation
/// `<group>/switchover-to` that plugins offering a switchover read.
pub async fn switchover(
    client: &Client,
    target: &Target,
    to: &str,
) -> Result<String, KubectlError> {
    let resource = resolve(client, &target.kind).await?;
    let annotation = format!("{}/switchover-to", resource.group);
    merge_patch(
        client,
        &resource,
        target,
        json!({ "metadata": { "annotations": { annotation.clone(): to } } }),
    )
    .await?;
    Ok(format!(
        "asked {} {}/{} to switch its primary to {to} ({annotation}); a plugin that offers no switchover ignores it\n",
        resource.kind, target.namespace, target.name
    ))
}

/// The loaded plugins, from the host's status ConfigMap in `plugin_namespace`: name →
/// summary.
async fn loaded(
    client: &Client,
    plugin_namespace: &str,
) -> Result<BTreeMap<String, Value>, KubectlError> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), plugin_namespace);
    let Some(status) = config_maps.get_opt(STATUS_CONFIG_MAP).await? else {
        return Err(KubectlError::Plugin(format!(
            "no ConfigMap {STATUS_CONFIG_MAP} in namespace {plugin_namespace}: is policy-host running there (--plugin-namespace)?"
        )));
    };
    Ok(status
        .data
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(key, text)| Some((key, serde_yaml::from_str::<Value>(&text).ok()?)))
        .collect())
}

/// `plugins`: what the host has loaded, with versions, modes, targets and grants.
pub async fn plugins(client: &Client, plugin_namespace: &str) -> Result<String, KubectlError> {
    let loaded = loaded(client, plugin_namespace).await?;
    if loaded.is_empty() {
        return Ok(format!("no plugin loaded (namespace {plugin_namespace})\n"));
    }
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let rows = loaded.values().map(|summary| {
        let granted = summary["granted"]
            .as_array()
            .map(|g| g.iter().map(text).collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        vec![
            text(&summary["name"]),
            text(&summary["version"]),
            text(&summary["mode"]),
            text(&summary["target"]),
            if granted.is_empty() {
                "none".to_owned()
            } else {
                granted
            },
            text(&summary["since"]),
        ]
    });
    Ok(table(
        &["PLUGIN", "VERSION", "MODE", "TARGET", "GRANTS", "SINCE"],
        rows,
    ))
}

/// `simulate`: the decision the loaded (active) plugin of the parent's kind would make on the
/// parent's live observation, without acting and without reaching the app (its app-calls and
/// sessions are listed, unanswered).
pub async fn simulate(
    client: &Client,
    target: &Target,
    plugin_namespace: &str,
    now: Timestamp,
) -> Result<String, KubectlError> {
    let resource = resolve(client, &target.kind).await?;
    let kind = format!("{}.{}", resource.plural, resource.api_version);
    let summary = loaded(client, plugin_namespace)
        .await?
        .into_values()
        .find(|s| s["target"] == json!(kind) && s["mode"] == json!("active"))
        .ok_or_else(|| KubectlError::NoPlugin(kind.clone()))?;
    let source = summary["source"].as_str().unwrap_or_default();
    let Some(config_map) = source
        .strip_prefix("configmap ")
        .and_then(|s| s.split_once('/'))
    else {
        return Err(KubectlError::Plugin(format!(
            "the plugin of {kind} was loaded from `{source}`, not a ConfigMap; run `policy-host simulate` on that file"
        )));
    };
    let pack_cm = Api::<ConfigMap>::namespaced(client.clone(), config_map.0)
        .get(config_map.1)
        .await?;
    let pack = PluginPack::from_config_map(
        &pack_cm,
        &PackDefaults {
            limits: Limits::default(),
            concurrency: 1,
        },
    )
    .map_err(|e| KubectlError::Plugin(e.to_string()))?;
    if let Some(pull) = &pack.pull {
        // The pull Secret and CA live in the cluster, for the host's ServiceAccount.
        return Err(KubectlError::Plugin(format!(
            "the plugin of {kind} is pulled by the host from {}; pull that component (`wkg oci pull`) and run `policy-host simulate` on it",
            pull.reference
        )));
    }
    let plugin = Sandbox::new()
        .map_err(|e| KubectlError::Plugin(e.to_string()))?
        .load(config_map.1, &pack.component, pack.limits)
        .await
        .map_err(|e| KubectlError::Plugin(e.to_string()))?;

    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &target.namespace, &resource);
    let mut parent = api.get(&target.name).await?;
    parent.metadata.managed_fields = None;
    let uid = parent.metadata.uid.clone().unwrap_or_default();
    let mut children = Vec::new();
    for child_kind in &plugin.info().children {
        for object in controlled(client, child_kind, &target.namespace, &uid).await? {
            children.push(Child {
                kind: child_kind.clone(),
                object: serde_json::to_string(&object).unwrap_or_default(),
            });
        }
    }
    let observation = Observation {
        parent: serde_json::to_string(&parent).unwrap_or_default(),
        children,
        now,
    };
    let script = AppCallScript::default();
    let scope = AppCallScope::scripted(
        format!("{}/{}", target.namespace, target.name),
        script.clone(),
    );
    let doing = format!("simulating {}/{}", target.namespace, target.name);
    let mut out = format!(
        "{} {}@{} on {} observed children, deciding without acting:\n",
        kind,
        plugin.info().name,
        plugin.info().version,
        observation.children.len()
    );
    match plugin.reconcile(&observation, scope, &doing).await {
        Ok(decision) => {
            for action in &decision.actions {
                let _ = writeln!(out, "  {}", action_line(action));
            }
            if decision.actions.is_empty() {
                out.push_str("  nothing to do\n");
            }
            if let Some(ms) = decision.requeue_after_ms {
                let _ = writeln!(out, "  then again in {ms} ms");
            }
        }
        Err(error) => {
            let _ = writeln!(out, "  refused: {error}");
        }
    }
    for call in script.calls() {
        let _ = writeln!(
            out,
            "  app-call {:?} {} on {}:{} (not made: simulate does not reach the app)",
            call.method, call.path, call.pod, call.port
        );
    }
    for round in script.exchanges() {
        let _ = writeln!(
            out,
            "  session with {}:{} (not made: simulate does not reach the app)",
            round.pod,
            round.port.as_deref().unwrap_or("*")
        );
    }
    Ok(out)
}

/// The objects of `kind` in `namespace` that the parent `uid` controls, less managedFields.
async fn controlled(
    client: &Client,
    kind: &KindRef,
    namespace: &str,
    uid: &str,
) -> Result<Vec<DynamicObject>, KubectlError> {
    let resource = ApiResource {
        group: kind.group.clone(),
        version: kind.version.clone(),
        api_version: kind.api_version(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
    };
    let api: Api<DynamicObject> = if kind.namespaced {
        Api::namespaced_with(client.clone(), namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|o| {
            o.owner_references()
                .iter()
                .any(|r| r.controller == Some(true) && r.uid == uid)
        })
        .map(|mut o| {
            o.metadata.managed_fields = None;
            o
        })
        .collect())
}

/// One action as a line: `apply Pod example-0`, `set-status`, `event Warning Degraded: ...`.
fn action_line(action: &Action) -> String {
    match action {
        Action::Apply(json) => {
            let object: Value = serde_json::from_str(json).unwrap_or_default();
            format!(
                "apply {} {}",
                object["kind"].as_str().unwrap_or("?"),
                object["metadata"]["name"].as_str().unwrap_or("?")
            )
        }
        Action::Delete(target) => format!("delete {} {}", target.kind.kind, target.name),
        Action::SetStatus(json) => format!("set-status ({} bytes)", json.len()),
        Action::RecordEvent(event) => format!(
            "event {} {}: {}",
            match event.event_type {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            event.reason,
            event.message
        ),
    }
}

/// `rows` under `headers`, columns padded to their widest cell; the last column unpadded.
fn table(headers: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut all: Vec<Vec<String>> = vec![headers.iter().map(|h| (*h).to_owned()).collect()];
    all.extend(rows);
    let widths: Vec<usize> = (0..headers.len())
        .map(|i| {
            all.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in all {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_read_as_kind_slash_name_or_say_how() {
        let target = Target::parse("etcdcluster/example", "db").expect("a target");
        assert_eq!(
            (target.kind.as_str(), target.name.as_str()),
            ("etcdcluster", "example")
        );
        for bad in ["example", "/x", "x/", "a/b/c"] {
            assert!(Target::parse(bad, "db").is_err(), "{bad}");
        }
    }

    #[test]
    fn tables_pad_every_column_but_the_last() {
        let text = table(
            &["A", "BB", "C"],
            [vec!["long".into(), "x".into(), "tail text".into()]],
        );
        assert_eq!(text, "A     BB  C\nlong  x   tail text\n");
    }

    #[test]
    fn fields_are_found_in_a_spec_schema_by_path() {
        let schema = json!({ "properties": { "backup": { "properties": { "trigger": { "type": "string" } } },
                                             "paused": { "type": "boolean" } } });
        assert!(has_field(&schema, &["paused"]));
        assert!(has_field(&schema, &["backup", "trigger"]));
        assert!(!has_field(&schema, &["trigger"]));
        assert!(!has_field(&Value::Null, &["paused"]));
    }
}
