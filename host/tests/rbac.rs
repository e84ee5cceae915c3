//! deploy/rbac.yaml and the bundles of `policies/` against what the host does and what the
//! plugins declare: the host's own role names no plugin kind and aggregates the bundles'
//! roles; every bundle's ClusterRole gives its plugin's target and child kinds the rules they
//! need, and nothing more (no kind the plugin does not declare, no write to a kind outside its
//! grants, no verb the host never uses, no cluster-wide Secrets, no creating arbitrary
//! ConfigMaps next to the plugin ConfigMaps); and every bundle carries the CRD and the plugin
//! its source generates today.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ConfigMap;
use policy_host::contract::KindRef;
use policy_host::decide::{Limits, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::bundle::AGGREGATE_LABEL;
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

/// The YAML documents of a file.
fn documents(path: &Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_yaml::Value::deserialize(document).expect("valid YAML"))
        .collect()
}

/// A role as written: (kind, name, labels, rules).
type RoleObject = (String, String, BTreeMap<String, String>, Vec<Rule>);

/// The role objects among `objects`.
fn roles_in(objects: &[serde_yaml::Value]) -> Vec<RoleObject> {
    objects
        .iter()
        .filter_map(|object| {
            let kind = object["kind"].as_str()?.to_string();
            if kind != "ClusterRole" && kind != "Role" {
                return None;
            }
            let name = object["metadata"]["name"].as_str()?.to_string();
            let labels: BTreeMap<String, String> =
                serde_yaml::from_value(object["metadata"]["labels"].clone()).unwrap_or_default();
            let rules: Vec<Rule> =
                serde_yaml::from_value(object["rules"].clone()).unwrap_or_default();
            Some((kind, name, labels, rules))
        })
        .collect()
}

/// The role objects of deploy/rbac.yaml: (kind, name, rules).
fn roles() -> Vec<(String, String, Vec<Rule>)> {
    roles_in(&documents(&repo_root().join("deploy/rbac.yaml")))
        .into_iter()
        .map(|(kind, name, _, rules)| (kind, name, rules))
        .collect()
}

/// `group/resource` → verbs, from ClusterRole rules meant for the cluster-wide role.
fn add_rules(granted: &mut BTreeMap<String, BTreeSet<String>>, rules: &[Rule]) {
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

/// `group/resource` → verbs the host's own ClusterRoles in deploy/rbac.yaml aggregate into the
/// ClusterRole `policy-host` (bound cluster-wide), plugins aside.
fn cluster_wide() -> BTreeMap<String, BTreeSet<String>> {
    let mut granted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (kind, _, labels, rules) in roles_in(&documents(&repo_root().join("deploy/rbac.yaml"))) {
        if kind == "ClusterRole" && labels.get(AGGREGATE_LABEL).is_some_and(|v| v == "true") {
            add_rules(&mut granted, &rules);
        }
    }
    granted
}

fn verbs(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|v| v.to_string()).collect()
}

/// One bundle of policies/: its plugin (loaded the way the host loads the ConfigMap), what the
/// plugin's grants let it write, and the bundle's other objects.
struct Bundle {
    file: PathBuf,
    plugin: String,
    target: KindRef,
    children: Vec<KindRef>,
    granted_kinds: Option<Vec<String>>,
    /// The component the bundle's ConfigMap carries (decompressed).
    component: Vec<u8>,
    objects: Vec<serde_yaml::Value>,
}

/// Every bundle in policies/, its plugin loaded the way the host loads a plugin ConfigMap.
async fn bundles() -> Vec<Bundle> {
    let loader = PluginLoader::new(Sandbox::new().expect("sandbox"), None);
    let defaults = PackDefaults {
        limits: Limits::default(),
        concurrency: 1,
    };
    let mut found = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(repo_root().join("policies"))
        .expect("policies/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let objects = documents(&path);
        let config_maps: Vec<&serde_yaml::Value> = objects
            .iter()
            .filter(|o| o["kind"].as_str() == Some("ConfigMap"))
            .collect();
        assert_eq!(
            config_maps.len(),
            1,
            "{}: one plugin ConfigMap",
            path.display()
        );
        let config_map: ConfigMap =
            serde_yaml::from_value(config_maps[0].clone()).expect("a plugin ConfigMap");
        let pack = PluginPack::from_config_map(&config_map, &defaults).expect("pack decodes");
        let source = path.display().to_string();
        let (plugin, _) = loader
            .load(&source, &pack.component, &pack.sha256, pack.limits)
            .await
            .expect("pack loads");
        let info = plugin.info().clone();
        found.push(Bundle {
            file: path,
            plugin: plugin.label().to_string(),
            target: info.target,
            children: info.children,
            granted_kinds: pack.grants.kinds.clone(),
            component: pack.component,
            objects,
        });
    }
    assert!(
        found.len() >= 2,
        "policies/ holds the etcd and Redis bundles"
    );
    found
}

/// What the host does with a policy's target kind: watch and list it, patch its finalizers,
/// and write its status (server-side apply on the status subresource). Written out here, not
/// taken from the host, so that a change to what bundles grant has to change this test too.
const TARGET_VERBS: &[&str] = &["list", "watch", "patch"];
const STATUS_VERBS: &[&str] = &["patch"];
/// What the host does with child kinds the plugin may write: watch and list them (labelled),
/// read one before the first apply (does it exist, and who controls it), create and patch
/// (server-side apply, which creates), delete.
const CHILD_VERBS: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
/// Pods the plugin may write may be evicted (chaos drills go through the Eviction API).
const EVICTION_VERBS: &[&str] = &["create"];
/// A declared child kind outside the plugin's granted kinds: watched, never written.
const WATCHED_VERBS: &[&str] = &["list", "watch"];
/// Events about parents: kube's recorder creates an Event and patches its series.
const EVENT_VERBS: &[&str] = &["create", "patch"];

/// deploy/rbac.yaml names no plugin's kind: the host's ClusterRole is aggregated from labelled
/// roles, and the host's own labelled role grants Events and nothing else.
#[test]
fn the_host_role_is_aggregated_and_names_no_plugin_kind() {
    let objects = documents(&repo_root().join("deploy/rbac.yaml"));
    let host_role = objects
        .iter()
        .find(|o| {
            o["kind"].as_str() == Some("ClusterRole")
                && o["metadata"]["name"].as_str() == Some("policy-host")
        })
        .expect("the ClusterRole policy-host");
    let selectors = &host_role["aggregationRule"]["clusterRoleSelectors"];
    assert_eq!(
        selectors[0]["matchLabels"][AGGREGATE_LABEL].as_str(),
        Some("true"),
        "the host's ClusterRole aggregates the labelled roles: {host_role:?}"
    );
    assert!(
        host_role["rules"]
            .as_sequence()
            .is_none_or(|rules| rules.is_empty()),
        "the aggregated role's rules are the controller's to write: {host_role:?}"
    );
    let mut expected = BTreeMap::new();
    expected.insert("events.k8s.io/events".to_owned(), verbs(EVENT_VERBS));
    assert_eq!(
        cluster_wide(),
        expected,
        "the host's own cluster-wide rights"
    );
}

#[tokio::test]
async fn every_bundle_grants_what_its_plugin_needs_and_no_more() {
    for bundle in bundles().await {
        let file = bundle.file.display();
        let mut needed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let target = &bundle.target;
        needed.insert(
            format!("{}/{}", target.group, target.plural),
            verbs(TARGET_VERBS),
        );
        needed.insert(
            format!("{}/{}/status", target.group, target.plural),
            verbs(STATUS_VERBS),
        );
        for child in &bundle.children {
            let writable = bundle
                .granted_kinds
                .as_ref()
                .is_none_or(|kinds| kinds.contains(&child.to_string()));
            needed.insert(
                format!("{}/{}", child.group, child.plural),
                verbs(if writable { CHILD_VERBS } else { WATCHED_VERBS }),
            );
            if writable && child.group.is_empty() && child.plural == "pods" {
                needed.insert("/pods/eviction".to_owned(), verbs(EVICTION_VERBS));
            }
        }
        let roles = roles_in(&bundle.objects);
        assert_eq!(roles.len(), 1, "{file}: one ClusterRole");
        let (kind, name, labels, rules) = &roles[0];
        assert_eq!(kind, "ClusterRole", "{file}");
        assert!(
            labels.get(AGGREGATE_LABEL).is_some_and(|v| v == "true"),
            "{file}: {name} is labelled for aggregation into the host's role"
        );
        let mut granted = BTreeMap::new();
        add_rules(&mut granted, rules);
        assert_eq!(
            granted, needed,
            "{file}: the ClusterRole of {} grants exactly what the host does with its kinds",
            bundle.plugin
        );
        assert!(
            !granted.contains_key("/secrets"),
            "{file}: no bundle reads Secrets cluster-wide"
        );
    }
}

/// Each bundle carries its plugin's CRD exactly as the generator wrote it to deploy/crds/, and
/// that CRD defines the plugin's target.
#[tokio::test]
async fn every_bundle_carries_its_generated_crd() {
    let generated: Vec<serde_yaml::Value> = std::fs::read_dir(repo_root().join("deploy/crds"))
        .expect("deploy/crds/")
        .flat_map(|entry| documents(&entry.expect("entry").path()))
        .collect();
    for bundle in bundles().await {
        let file = bundle.file.display();
        let crds: Vec<&serde_yaml::Value> = bundle
            .objects
            .iter()
            .filter(|o| o["kind"].as_str() == Some("CustomResourceDefinition"))
            .collect();
        let target = &bundle.target;
        let name = format!("{}.{}", target.plural, target.group);
        let crd = crds
            .iter()
            .find(|c| c["metadata"]["name"].as_str() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("{file}: no CRD {name} for {}", bundle.plugin));
        assert!(
            generated.iter().any(|g| g == *crd),
            "{file}: the CRD {name} differs from deploy/crds/; run `cargo xtask crdgen` then `cargo xtask pack-policies`"
        );
        // The ConfigMap comes last, so the kind and the rights exist when the host loads it.
        assert_eq!(
            bundle.objects.last().and_then(|o| o["kind"].as_str()),
            Some("ConfigMap"),
            "{file}: the plugin ConfigMap is the last document"
        );
    }
}

/// The install path (README, install suite, demo) applies `policies/` as committed: a plugin
/// change that is not packed again would be tested and shipped as the old plugin. The plugin
/// builds are reproducible (workspace paths relative, `CARGO_HOME` remapped, the profile
/// fixed), so the plugin in `policies/<name>.yaml` equals a fresh build of `guest-<name>`.
#[tokio::test]
async fn every_bundle_carries_the_plugin_its_source_builds() {
    for bundle in bundles().await {
        let stem = bundle
            .file
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a UTF-8 file name");
        let package = format!("guest-{stem}");
        let built = policy_host_test_plugins::build(&package)
            .unwrap_or_else(|e| panic!("{}: building {package}: {e}", bundle.file.display()));
        let built = std::fs::read(&built).expect("the built plugin");
        let first_difference = built
            .iter()
            .zip(&bundle.component)
            .position(|(a, b)| a != b)
            .or((built.len() != bundle.component.len())
                .then(|| built.len().min(bundle.component.len())));
        if let Some(at) = first_difference {
            panic!(
                "{}: its plugin differs from what {package} builds today (from byte {at}; {} \
                 bytes packed, {} built); run `cargo xtask pack-policies` and commit policies/",
                bundle.file.display(),
                bundle.component.len(),
                built.len()
            );
        }
    }
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
/// ClusterRole meant for per-namespace RoleBindings grants `get` on secrets, and `create` for
/// generated credentials, and nothing else (no list, watch, update or delete).
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
    assert_eq!(rules[0].verbs, ["get", "create"]);
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
