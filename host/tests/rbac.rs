//! deploy/rbac.yaml against what the host does and what the packed plugins declare: every
//! packed plugin in `policies/` gets the rules its target and child kinds need, and nothing
//! more (no kind no plugin declares, no verb the host never uses, no cluster-wide Secrets, no
//! creating arbitrary ConfigMaps next to the plugin ConfigMaps).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ConfigMap;
use policy_host::contract::KindRef;
use policy_host::decide::{Limits, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::pack::{PackDefaults, PluginPack};
use serde::Deserialize;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One RBAC rule, as written in the YAML.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    #[serde(default)]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
}

/// The role objects of deploy/rbac.yaml: (kind, name, rules).
fn roles() -> Vec<(String, String, Vec<Rule>)> {
    let text = std::fs::read_to_string(repo_root().join("deploy/rbac.yaml")).expect("rbac.yaml");
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_yaml::Value::deserialize(document).expect("valid YAML"))
        .filter_map(|object| {
            let kind = object["kind"].as_str()?.to_string();
            if kind != "ClusterRole" && kind != "Role" {
                return None;
            }
            let name = object["metadata"]["name"].as_str()?.to_string();
            let rules: Vec<Rule> =
                serde_yaml::from_value(object["rules"].clone()).expect("rules parse");
            Some((kind, name, rules))
        })
        .collect()
}

/// `group/resource` → verbs granted cluster-wide by the ClusterRole the host is bound to with
/// a ClusterRoleBinding (`policy-host`).
fn cluster_wide() -> BTreeMap<String, BTreeSet<String>> {
    let mut granted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (kind, name, rules) in roles() {
        if kind != "ClusterRole" || name != "policy-host" {
            continue;
        }
        for rule in rules {
            assert!(
                rule.resource_names.is_empty(),
                "the cluster-wide role names no objects: {rule:?}"
            );
            for group in &rule.api_groups {
                for resource in &rule.resources {
                    granted
                        .entry(format!("{group}/{resource}"))
                        .or_default()
                        .extend(rule.verbs.iter().cloned());
                }
            }
        }
    }
    granted
}

fn verbs(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|v| v.to_string()).collect()
}

/// Every packed plugin's describe(), loaded the way the host loads a plugin ConfigMap.
async fn packed_plugins() -> Vec<(String, KindRef, Vec<KindRef>)> {
    let loader = PluginLoader::new(Sandbox::new().expect("sandbox"), None);
    let defaults = PackDefaults {
        limits: Limits::default(),
        concurrency: 1,
    };
    let mut described = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(repo_root().join("policies"))
        .expect("policies/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).expect("pack readable");
        let config_map: ConfigMap = serde_yaml::from_str(&text).expect("a pack is a ConfigMap");
        let pack = PluginPack::from_config_map(&config_map, &defaults).expect("pack decodes");
        let source = path.display().to_string();
        let (plugin, _) = loader
            .load(&source, &pack.component, &pack.sha256, pack.limits)
            .await
            .expect("pack loads");
        let info = plugin.info().clone();
        described.push((plugin.label().to_string(), info.target, info.children));
    }
    assert!(
        described.len() >= 2,
        "policies/ holds the etcd and Redis packs"
    );
    described
}

/// What the host does with a policy's target kind: watch and list it, patch its finalizers,
/// and write its status (server-side apply on the status subresource).
const TARGET_VERBS: &[&str] = &["list", "watch", "patch"];
const STATUS_VERBS: &[&str] = &["patch"];
/// What the host does with child kinds: watch and list them (labelled), read one before the
/// first apply (does it exist, and who controls it), create and patch (server-side apply,
/// which creates), delete.
const CHILD_VERBS: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
/// Events about parents: kube's recorder creates an Event and patches its series.
const EVENT_VERBS: &[&str] = &["create", "patch"];

#[tokio::test]
async fn every_packed_plugin_has_the_rules_it_needs_and_no_more() {
    let granted = cluster_wide();
    let mut needed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    needed.insert("events.k8s.io/events".into(), verbs(EVENT_VERBS));
    let mut missing = Vec::new();
    for (plugin, target, children) in packed_plugins().await {
        let mut want = vec![
            (format!("{}/{}", target.group, target.plural), TARGET_VERBS),
            (
                format!("{}/{}/status", target.group, target.plural),
                STATUS_VERBS,
            ),
        ];
        for child in &children {
            want.push((format!("{}/{}", child.group, child.plural), CHILD_VERBS));
        }
        for (resource, wanted) in want {
            let have = granted.get(&resource).cloned().unwrap_or_default();
            let lacking: Vec<&&str> = wanted.iter().filter(|v| !have.contains(**v)).collect();
            if !lacking.is_empty() {
                missing.push(format!("{plugin}: {resource} lacks {lacking:?}"));
            }
            needed.entry(resource).or_default().extend(verbs(wanted));
        }
    }
    assert!(
        missing.is_empty(),
        "deploy/rbac.yaml misses rules packed plugins need:\n{}",
        missing.join("\n")
    );
    let extra: Vec<String> = granted
        .iter()
        .filter_map(|(resource, have)| {
            let need = needed.get(resource).cloned().unwrap_or_default();
            let more: Vec<&String> = have.difference(&need).collect();
            (!more.is_empty()).then(|| format!("{resource}: {more:?}"))
        })
        .collect();
    assert!(
        extra.is_empty(),
        "the ClusterRole grants what neither the host nor any packed plugin uses (cluster-wide \
         Secrets belong in per-namespace bindings):\n{}",
        extra.join("\n")
    );
}

/// The host's own namespace holds the plugin ConfigMaps (code it runs): it reads them, patches
/// one annotation on a superseded one, and creates nothing there but its status ConfigMap.
#[test]
fn the_plugin_namespace_role_creates_only_the_status_config_map() {
    let (_, _, rules) = roles()
        .into_iter()
        .find(|(kind, name, _)| kind == "Role" && name == "policy-host-plugins")
        .expect("the Role policy-host-plugins");
    let rules: Vec<&Rule> = rules
        .iter()
        .filter(|r| r.resources.iter().any(|r| r == "configmaps"))
        .collect();
    for rule in &rules {
        assert_eq!(rule.resources, ["configmaps"], "{rule:?}");
        for verb in ["update", "delete", "deletecollection", "*"] {
            assert!(!rule.verbs.iter().any(|v| v == verb), "{verb}: {rule:?}");
        }
        if rule.verbs.iter().any(|v| v == "create") {
            assert_eq!(rule.resource_names, ["policy-host-status"], "{rule:?}");
        }
    }
    let all: BTreeSet<&str> = rules
        .iter()
        .flat_map(|r| r.verbs.iter().map(String::as_str))
        .collect();
    assert_eq!(
        all,
        BTreeSet::from(["create", "get", "list", "patch", "watch"]),
        "{rules:?}"
    );
}

/// Secrets are read one by one in the namespaces an admin binds, never cluster-wide: the
/// ClusterRole meant for per-namespace RoleBindings grants `get` on secrets and nothing else.
#[test]
fn secrets_are_readable_only_through_a_per_namespace_binding() {
    let granted = cluster_wide();
    assert!(
        !granted.contains_key("/secrets"),
        "the cluster-wide role reads every Secret of the cluster"
    );
    let (_, _, rules) = roles()
        .into_iter()
        .find(|(kind, name, _)| kind == "ClusterRole" && name == "policy-host-secrets")
        .expect("the ClusterRole policy-host-secrets, for RoleBindings per namespace");
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0].api_groups, [""]);
    assert_eq!(rules[0].resources, ["secrets"]);
    assert_eq!(rules[0].verbs, ["get"]);
    let text = std::fs::read_to_string(repo_root().join("deploy/rbac.yaml")).expect("rbac.yaml");
    let binds_it_cluster_wide = serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_yaml::Value::deserialize(document).expect("valid YAML"))
        .any(|object| {
            object["kind"].as_str() == Some("ClusterRoleBinding")
                && object["roleRef"]["name"].as_str() == Some("policy-host-secrets")
        });
    assert!(
        !binds_it_cluster_wide,
        "policy-host-secrets is bound per namespace only"
    );
}
