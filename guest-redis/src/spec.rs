//! The `RedisReplication` custom resource: spec and status types, and the CRD built from them.
//!
//! The doc comments on fields become the field descriptions of the generated CRD schema
//! (`cargo xtask crdgen`, feature `crd`).

pub use policy_host_sdk::conditions::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Redis version used when `spec.version` is not set: Debian 12's.
pub const DEFAULT_VERSION: &str = "7.0.15";

/// Most Redis servers one resource may run.
pub const MAX_REPLICAS: i32 = 9;

fn default_version() -> String {
    DEFAULT_VERSION.to_owned()
}

fn default_replicas() -> i32 {
    3
}

/// Desired state of a Redis primary with replicas.
// Each printer column repeats `type_ = "string"`, which clippy takes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    derive(kube::CustomResource),
    kube(
        group = "redis.policy-host.io",
        version = "v1alpha1",
        kind = "RedisReplication",
        plural = "redisreplications",
        namespaced,
        status = "RedisReplicationStatus",
        shortname = "redisrepl",
        doc = "A Redis primary and its replicas, run by policy-host's redis plugin.",
        scale(
            spec_replicas_path = ".spec.replicas",
            status_replicas_path = ".status.readyReplicas"
        ),
        printcolumn(
            name = "Replicas",
            type_ = "integer",
            json_path = ".spec.replicas",
            description = "Redis servers, the primary included"
        ),
        printcolumn(
            name = "Primary",
            type_ = "string",
            json_path = ".status.primary",
            description = "The Pod the client Service points at"
        ),
        printcolumn(
            name = "Following",
            type_ = "integer",
            json_path = ".status.followingReplicas",
            description = "Replicas whose link to the primary is up"
        ),
        printcolumn(
            name = "Version",
            type_ = "string",
            json_path = ".spec.version",
            description = "Redis version"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RedisReplicationSpec {
    /// Number of Redis servers, the primary included (1..9): `3` is one primary and two
    /// replicas.
    #[serde(default = "default_replicas")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 1 && self <= 9",
        "message": "spec.replicas must be 1 to 9 (the primary included)"
    }]))]
    pub replicas: i32,
    /// Redis version (`7.0.15`); the image is `redis:<version>`. Read when a server's Pod is
    /// created.
    #[serde(default = "default_version")]
    #[schemars(length(max = 32), extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^[0-9]+[.][0-9]+[.][0-9]+$')",
        "message": "spec.version must be a Redis version such as 7.0.15"
    }]))]
    pub version: String,
}

impl Default for RedisReplicationSpec {
    fn default() -> Self {
        Self {
            replicas: default_replicas(),
            version: default_version(),
        }
    }
}

impl RedisReplicationSpec {
    /// Why the spec cannot be run, as a message naming the field to fix.
    pub fn invalid(&self) -> Option<String> {
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Some(format!(
                "spec.replicas is {}; set it between 1 and {MAX_REPLICAS}",
                self.replicas
            ));
        }
        let parts: Vec<&str> = self.version.split('.').collect();
        if parts.len() != 3 || parts.iter().any(|p| p.parse::<u32>().is_err()) {
            return Some(format!(
                "spec.version `{}` is not a version like 7.0.15; fix spec.version",
                self.version
            ));
        }
        None
    }
}

/// Observed state, written by the plugin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisReplicationStatus {
    /// The Pod serving as primary: the client Service points at it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// Pods replicating from the primary with their link up.
    #[serde(default)]
    pub replicas: Vec<String>,
    /// How many replicas follow the primary (the length of `replicas`).
    #[serde(default)]
    pub following_replicas: i32,
    /// Servers answering, the primary included.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Available` (the primary serves), `Progressing` (servers starting or catching up),
    /// `Degraded` (a spec that cannot run, a lost primary, fewer replicas than asked).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The CRD, from the types above.
#[cfg(feature = "crd")]
pub fn custom_resource_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    RedisReplication::crd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_validation_table() {
        let rows = [
            (
                "the default spec runs",
                RedisReplicationSpec::default(),
                None,
            ),
            (
                "zero servers is refused",
                RedisReplicationSpec {
                    replicas: 0,
                    ..Default::default()
                },
                Some("spec.replicas"),
            ),
            (
                "ten servers is refused",
                RedisReplicationSpec {
                    replicas: 10,
                    ..Default::default()
                },
                Some("spec.replicas"),
            ),
            (
                "a version that is not x.y.z is refused",
                RedisReplicationSpec {
                    version: "latest".into(),
                    ..Default::default()
                },
                Some("spec.version"),
            ),
        ];
        for (situation, spec, want) in rows {
            let got = spec.invalid();
            match want {
                None => assert_eq!(got, None, "{situation}"),
                Some(field) => assert!(
                    got.as_deref().is_some_and(|m| m.contains(field)),
                    "{situation}: {got:?}"
                ),
            }
        }
    }

    #[cfg(feature = "crd")]
    #[test]
    fn the_crd_has_its_printer_columns_and_short_name() {
        let crd = custom_resource_definition();
        assert_eq!(
            crd.spec.names.short_names,
            Some(vec!["redisrepl".to_owned()])
        );
        let columns = crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default();
        let names: Vec<_> = columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["Replicas", "Primary", "Following", "Version", "Age"]
        );
    }
}
