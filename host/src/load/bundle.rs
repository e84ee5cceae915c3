//! One-apply bundles: everything a plugin needs in a cluster beside its ConfigMap — its CRDs
//! and a ClusterRole with exactly the rules the host uses on its kinds, labelled for
//! aggregation into the host's own ClusterRole.
//!
//! The host's role in `deploy/rbac.yaml` carries an `aggregationRule` selecting
//! [`AGGREGATE_LABEL`]; kube-controller-manager's clusterrole-aggregation controller copies the
//! rules of every labelled ClusterRole into it. So loading a plugin is one
//! `kubectl apply --server-side -f` of its bundle, and unloading it (deleting the bundle) takes
//! its rights away again. Whoever can create a labelled ClusterRole can widen the host's rights,
//! but the API server lets only those who already hold a right grant it (RBAC's escalation
//! check), so that is no one who could not bind the rights directly.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ObjectMeta;

use crate::contract::{KindRef, PolicyInfo};

/// The label that aggregates a ClusterRole's rules into the host's ClusterRole.
pub const AGGREGATE_LABEL: &str = "policy-host.io/aggregate-to-host";

/// What the host does with a policy's target kind: watch and list it, and patch its finalizers
/// (a merge patch pinned to the resourceVersion).
pub const TARGET_VERBS: &[&str] = &["list", "watch", "patch"];
/// The target's status subresource: server-side apply of the plugin's status.
pub const STATUS_VERBS: &[&str] = &["patch"];
/// A child kind the plugin may write: watch and list (the labelled child caches), read one
/// object before its first apply (does it exist, who controls it), create and patch
/// (server-side apply, which creates), delete.
pub const CHILD_VERBS: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
/// Pods a plugin may write may also be evicted (chaos drills go through the Eviction API, so
/// the plugin's PodDisruptionBudget and the pod's grace period hold): weaker than `delete`.
pub const EVICTION_VERBS: &[&str] = &["create"];
/// A child kind the plugin declares but its grants do not let it write: the host still watches
/// it (the plugin observes it), and writes nothing.
pub const WATCHED_CHILD_VERBS: &[&str] = &["list", "watch"];

/// Why a bundle cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A CRD file cannot be read.
    #[error("cannot read the CRD file {file}: {source}; check the path given with --crd")]
    Read {
        /// The file given.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A CRD file is not a CustomResourceDefinition.
    #[error(
        "{file} is not a CustomResourceDefinition ({reason}); give --crd the plugin crate's generated CRD (e.g. deploy/crds/etcdcluster.yaml from `cargo xtask crdgen`)"
    )]
    NotACrd {
        /// The file given.
        file: String,
        /// What the parser said.
        reason: String,
    },
    /// No CRD given defines the plugin's target kind.
    #[error(
        "no CRD given defines the plugin's target {target} (group {group}, plural {plural}, version {version}); the CRDs given define {given:?}: pass the target's CRD with --crd"
    )]
    NoTargetCrd {
        /// The target, as `plural.apiVersion`.
        target: String,
        /// Its group.
        group: String,
        /// Its plural.
        plural: String,
        /// Its version.
        version: String,
        /// What the CRDs given define (`plural.group`).
        given: Vec<String>,
    },
}

/// A CRD file for a bundle: its text as generated, and what it defines.
#[derive(Clone, Debug)]
pub struct CrdDocument {
    /// The YAML as the plugin crate's generator wrote it (comments kept).
    pub text: String,
    /// The parsed definition.
    pub crd: CustomResourceDefinition,
}

impl CrdDocument {
    /// Reads and parses the CRD file at `path`.
    pub fn read(path: &std::path::Path) -> Result<Self, BundleError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| BundleError::Read {
            file: file.clone(),
            source,
        })?;
        Self::parse(&file, text)
    }

    /// Parses `text` (read from `file`) as one CustomResourceDefinition.
    pub fn parse(file: &str, text: String) -> Result<Self, BundleError> {
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&text).map_err(|e| BundleError::NotACrd {
                file: file.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(CrdDocument { text, crd })
    }

    /// Whether this CRD serves `kind` (same group, plural and a served version of its name).
    fn defines(&self, kind: &KindRef) -> bool {
        let spec = &self.crd.spec;
        spec.group == kind.group
            && spec.names.plural == kind.plural
            && spec
                .versions
                .iter()
                .any(|v| v.name == kind.version && v.served)
    }
}

/// The rules the host needs for one plugin: its target (and status), every declared child kind
/// to watch, and the write verbs for the child kinds its grants let it write (`granted_kinds`:
/// `None` is every declared kind). One rule per resource, in the plugin's order, so the
/// ClusterRole reads like the plugin's `describe()`.
pub fn plugin_rules(info: &PolicyInfo, granted_kinds: Option<&[String]>) -> Vec<PolicyRule> {
    let rule = |group: &str, resource: String, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    let target = &info.target;
    let mut rules = vec![
        rule(&target.group, target.plural.clone(), TARGET_VERBS),
        rule(
            &target.group,
            format!("{}/status", target.plural),
            STATUS_VERBS,
        ),
    ];
    for child in &info.children {
        let writable = granted_kinds.is_none_or(|kinds| kinds.contains(&child.to_string()));
        let verbs = if writable {
            CHILD_VERBS
        } else {
            WATCHED_CHILD_VERBS
        };
        rules.push(rule(&child.group, child.plural.clone(), verbs));
        if writable && child.group.is_empty() && child.plural == "pods" {
            rules.push(rule("", "pods/eviction".to_owned(), EVICTION_VERBS));
        }
    }
    rules
}

/// The plugin's ClusterRole, named after its ConfigMap, labelled for aggregation.
pub fn plugin_cluster_role(
    config_map: &str,
    info: &PolicyInfo,
    granted_kinds: Option<&[String]>,
) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(format!("policy-host-{config_map}")),
            labels: Some(
                [
                    (AGGREGATE_LABEL.to_owned(), "true".to_owned()),
                    (
                        "app.kubernetes.io/part-of".to_owned(),
                        "policy-host".to_owned(),
                    ),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        rules: Some(plugin_rules(info, granted_kinds)),
        aggregation_rule: None,
    }
}

/// Checks that the CRDs given define the plugin's target, so a bundle never ships a plugin
/// without the kind it reconciles (or with another plugin's CRD instead).
pub fn check_crds(info: &PolicyInfo, crds: &[CrdDocument]) -> Result<(), BundleError> {
    if crds.iter().any(|crd| crd.defines(&info.target)) {
        return Ok(());
    }
    let target = &info.target;
    Err(BundleError::NoTargetCrd {
        target: target.to_string(),
        group: target.group.clone(),
        plural: target.plural.clone(),
        version: target.version.clone(),
        given: crds
            .iter()
            .map(|c| format!("{}.{}", c.crd.spec.names.plural, c.crd.spec.group))
            .collect(),
    })
}

/// The bundle as one multi-document YAML: the CRDs first (so the kind exists when the plugin
/// starts watching it), then the ClusterRole (so the host may watch it), then the plugin
/// ConfigMap (`config_map_yaml`, as `pack` writes it) last.
pub fn render(
    header: &str,
    crds: &[CrdDocument],
    role: &ClusterRole,
    config_map_yaml: &str,
) -> Result<String, serde_yaml::Error> {
    let mut out = String::from(header);
    for crd in crds {
        out.push_str("---\n");
        out.push_str(crd.text.trim_start_matches("---\n"));
        if !crd.text.ends_with('\n') {
            out.push('\n');
        }
    }
    out.push_str("---\n# What the host needs on this plugin's kinds, aggregated into its ClusterRole `policy-host`.\n");
    // k8s-openapi's types serialize with their apiVersion and kind.
    out.push_str(&serde_yaml::to_string(role)?);
    out.push_str("---\n");
    out.push_str(config_map_yaml);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(group: &str, version: &str, kind: &str, plural: &str) -> KindRef {
        KindRef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
        }
    }

    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "etcd".into(),
            version: "0.1.0".into(),
            target: kind(
                "etcd.database.coreos.com",
                "v1beta2",
                "EtcdCluster",
                "etcdclusters",
            ),
            children: vec![
                kind("", "v1", "Pod", "pods"),
                kind(
                    "policy",
                    "v1",
                    "PodDisruptionBudget",
                    "poddisruptionbudgets",
                ),
            ],
            capabilities: vec![],
            wants_finalizer: true,
        }
    }

    const CRD: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: etcdclusters.etcd.database.coreos.com\nspec:\n  group: etcd.database.coreos.com\n  names:\n    kind: EtcdCluster\n    plural: etcdclusters\n  scope: Namespaced\n  versions:\n  - name: v1beta2\n    served: true\n    storage: true\n";

    fn resources(rules: &[PolicyRule]) -> Vec<(String, Vec<String>)> {
        rules
            .iter()
            .map(|r| {
                (
                    format!(
                        "{}/{}",
                        r.api_groups.as_ref().expect("groups")[0],
                        r.resources.as_ref().expect("resources")[0]
                    ),
                    r.verbs.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn rules_cover_the_target_its_status_and_each_child() {
        let rules = resources(&plugin_rules(&info(), None));
        let names: Vec<&str> = rules.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "etcd.database.coreos.com/etcdclusters",
                "etcd.database.coreos.com/etcdclusters/status",
                "/pods",
                "/pods/eviction",
                "policy/poddisruptionbudgets"
            ]
        );
        assert_eq!(rules[0].1, TARGET_VERBS);
        assert_eq!(rules[1].1, STATUS_VERBS);
        assert_eq!(rules[2].1, CHILD_VERBS);
        assert_eq!(rules[3].1, EVICTION_VERBS);
        assert_eq!(rules[4].1, CHILD_VERBS);
    }

    #[test]
    fn a_kind_outside_the_grants_is_only_watched() {
        let granted = vec!["pods.v1".to_owned()];
        let rules = resources(&plugin_rules(&info(), Some(&granted)));
        assert_eq!(rules[2].1, CHILD_VERBS);
        assert_eq!(rules[4].1, WATCHED_CHILD_VERBS);
        let granted = vec!["poddisruptionbudgets.policy/v1".to_owned()];
        let rules = resources(&plugin_rules(&info(), Some(&granted)));
        assert!(
            !rules.iter().any(|(r, _)| r == "/pods/eviction"),
            "pods it may not write, it may not evict either: {rules:?}"
        );
    }

    #[test]
    fn the_role_is_labelled_for_aggregation_and_named_after_the_config_map() {
        let role = plugin_cluster_role("plugin-etcd", &info(), None);
        assert_eq!(
            role.metadata.name.as_deref(),
            Some("policy-host-plugin-etcd")
        );
        assert_eq!(
            role.metadata.labels.expect("labels")[AGGREGATE_LABEL],
            "true".to_owned()
        );
    }

    #[test]
    fn the_target_crd_is_required_and_a_wrong_one_named() {
        let crd = CrdDocument::parse("etcd.yaml", CRD.into()).expect("a CRD");
        check_crds(&info(), std::slice::from_ref(&crd)).expect("defines the target");
        let other = CrdDocument::parse(
            "redis.yaml",
            CRD.replace("etcdclusters", "redisreplications"),
        )
        .expect("parses");
        let error = check_crds(&info(), &[other])
            .expect_err("refused")
            .to_string();
        assert!(
            error.contains("redisreplications.etcd.database.coreos.com"),
            "{error}"
        );
        assert!(error.contains("--crd"), "{error}");
        let unserved = CrdDocument::parse("old.yaml", CRD.replace("served: true", "served: false"))
            .expect("parses");
        assert!(check_crds(&info(), &[unserved]).is_err());
        let not_a_crd =
            CrdDocument::parse("cm.yaml", "kind: ConfigMap\n".into()).expect_err("refused");
        assert!(not_a_crd.to_string().contains("cm.yaml"), "{not_a_crd}");
    }

    #[test]
    fn a_bundle_is_crds_then_role_then_config_map() {
        let crd = CrdDocument::parse("etcd.yaml", CRD.into()).expect("a CRD");
        let role = plugin_cluster_role("plugin-etcd", &info(), None);
        let yaml = render(
            "# header\n",
            &[crd],
            &role,
            "apiVersion: v1\nkind: ConfigMap\n",
        )
        .expect("parses");
        let kinds: Vec<String> = serde_yaml::Deserializer::from_str(&yaml)
            .map(|d| {
                let v = <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("parses");
                v["kind"].as_str().expect("parses").to_owned()
            })
            .collect();
        assert_eq!(
            kinds,
            ["CustomResourceDefinition", "ClusterRole", "ConfigMap"]
        );
        assert!(yaml.starts_with("# header\n"));
    }
}
