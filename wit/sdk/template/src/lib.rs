//! The `plugin-template` policy plugin: for each `PluginTemplate` resource it keeps one
//! ConfigMap, `<name>-config`, holding `spec.greeting`, and reports a `Ready` condition.
//!
//! This is the smallest complete plugin; replace the spec, the child and the decision with
//! your app's. Build, test and pack it as `README.md` says.

use policy_host_sdk::conditions::Condition;
use policy_host_sdk::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The custom resource this plugin reconciles (the parent).
pub fn target_kind() -> KindRef {
    KindRef::namespaced(
        "plugin-template.example.com",
        "v1",
        "PluginTemplate",
        "plugintemplates",
    )
}

/// A `PluginTemplate` as the host hands it over. Only the fields the plugin reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PluginTemplate {
    /// `metadata.name` and `metadata.generation`.
    pub metadata: Metadata,
    /// What the user asked for.
    #[serde(default)]
    pub spec: PluginTemplateSpec,
    /// What the plugin last reported.
    #[serde(default)]
    pub status: Option<PluginTemplateStatus>,
}

/// The parts of `metadata` the plugin reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// The resource's name.
    pub name: String,
    /// Bumped by the API server on every spec change.
    #[serde(default)]
    pub generation: Option<i64>,
}

/// `spec`: what the user asks for (its JSON schema belongs in the CRD, see `crd.yaml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginTemplateSpec {
    /// The text the ConfigMap holds.
    #[serde(default = "default_greeting")]
    pub greeting: String,
}

impl Default for PluginTemplateSpec {
    fn default() -> Self {
        PluginTemplateSpec {
            greeting: default_greeting(),
        }
    }
}

fn default_greeting() -> String {
    "hello".to_owned()
}

/// `status`: what the plugin reports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginTemplateStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: the ConfigMap holds the greeting.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The plugin.
pub struct PluginTemplatePlugin;

policy_host_sdk::export_plugin!(PluginTemplatePlugin);

/// Name of the ConfigMap a resource owns.
pub fn config_map_name(parent: &str) -> String {
    format!("{parent}-config")
}

impl Plugin for PluginTemplatePlugin {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "plugin-template".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            target: target_kind(),
            children: vec![children::config_map_kind()],
            capabilities: Vec::new(),
            wants_finalizer: false,
        }
    }

    fn reconcile(
        observation: &Observation,
        _app: &mut dyn AppCall,
    ) -> Result<Decision, PolicyError> {
        let parent: PluginTemplate = observation.parent()?;
        if parent.spec.greeting.trim().is_empty() {
            return Err(PolicyError::new(
                "InvalidSpec",
                format!(
                    "{}: spec.greeting is empty; set it to the text the ConfigMap should hold",
                    parent.metadata.name
                ),
            ));
        }
        let kind = children::config_map_kind();
        let name = config_map_name(&parent.metadata.name);
        let data = json!({ "greeting": parent.spec.greeting });
        let desired = children::child_object(
            &kind,
            &name,
            &[("app.kubernetes.io/managed-by", "plugin-template")],
            json!({ "data": data }),
        );

        // Ready once the host's cache shows the ConfigMap with the wanted data.
        let current = observation.child_named(&kind, &name);
        let ready = match current {
            Some(child) => child.parse::<serde_json::Value>()?["data"] == data,
            None => false,
        };
        let mut status = parent.status.unwrap_or_default();
        status.observed_generation = parent.metadata.generation;
        let condition = if ready {
            Condition::new(
                "Ready",
                true,
                "ConfigMapReady",
                format!("{name} holds the greeting"),
            )
        } else {
            Condition::new("Ready", false, "Applying", format!("applying {name}"))
        };
        set_condition(
            &mut status.conditions,
            condition.observed(parent.metadata.generation),
            observation.now,
        );

        // Apply the whole desired object every time: server-side apply makes a repeat a no-op.
        Ok(Decision::nothing()
            .with(Action::Apply(desired))
            .with(Action::set_status(&status)?))
    }
}

#[cfg(test)]
mod tests {
    use policy_host_sdk::testing::{Harness, observation};

    use super::*;

    fn parent(spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "plugin-template.example.com/v1",
            "kind": "PluginTemplate",
            "metadata": { "name": "demo", "namespace": "default", "generation": 1 },
            "spec": spec,
        })
    }

    #[test]
    fn describe_declares_the_parent_and_the_config_map() {
        let info = PluginTemplatePlugin::describe();
        assert_eq!(info.target, target_kind());
        assert_eq!(info.children, vec![children::config_map_kind()]);
    }

    #[test]
    fn decisions_table() {
        // (situation, spec, greeting in the ConfigMap, Ready)
        let cases = [
            (
                "a new resource gets its ConfigMap",
                json!({ "greeting": "hi" }),
                "hi",
                "False",
            ),
            (
                "an empty spec uses the default greeting",
                json!({}),
                "hello",
                "False",
            ),
        ];
        for (situation, spec, greeting, ready) in cases {
            let mut harness = Harness::<PluginTemplatePlugin>::new();
            let decision = harness
                .reconcile(&observation(parent(spec)).build())
                .unwrap_or_else(|e| panic!("{situation}: refused: {e}"));
            let config_map = decision.applied("ConfigMap", "demo-config");
            assert_eq!(
                config_map.map(|c| c["data"]["greeting"].clone()),
                Some(json!(greeting)),
                "{situation}"
            );
            let status = decision.status().cloned().unwrap_or_default();
            assert_eq!(status["conditions"][0]["status"], ready, "{situation}");
        }
    }

    #[test]
    fn an_empty_greeting_is_refused() {
        let mut harness = Harness::<PluginTemplatePlugin>::new();
        let refused = harness.reconcile(&observation(parent(json!({ "greeting": " " }))).build());
        assert_eq!(refused.map_err(|e| e.reason), Err("InvalidSpec".to_owned()));
    }

    #[test]
    fn converges_to_ready_and_then_stays_put() {
        let mut harness = Harness::<PluginTemplatePlugin>::new();
        let settled =
            harness.converge(&observation(parent(json!({ "greeting": "hi" }))).build(), 5);
        let status: serde_json::Value = settled
            .parent_json()
            .map(|p| p["status"].clone())
            .unwrap_or_default();
        assert_eq!(status["conditions"][0]["status"], "True");
        assert_eq!(status["observedGeneration"], 1);
        // Idempotent: the same observation, later, gives the same decision.
        let again = harness.reconcile(&settled).map_err(|e| e.to_string());
        let later = harness.reconcile(&Observation {
            now: Timestamp {
                seconds: settled.now.seconds + 3_600,
                nanoseconds: 0,
            },
            ..settled.clone()
        });
        assert_eq!(again, later.map_err(|e| e.to_string()));
    }
}
