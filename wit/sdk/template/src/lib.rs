//! The `plugin-template` policy plugin: for each `PluginTemplate` resource it keeps one
//! ConfigMap, `<name>-config`, holding `spec.greeting`, and `spec.replicas` app Pods
//! (`<name>-0`, ...) running `spec.image`; it asks each running Pod over a session whether it
//! answers (`PING` → `+PONG`, Redis' protocol, the default image's), and reports a `Ready`
//! condition once the ConfigMap is in place and every Pod answered.
//!
//! This is the smallest complete plugin; replace the spec, the children, the protocol and the
//! decision with your app's. Build, test and pack it as `README.md` says.

use policy_host_sdk::children::{Container, Pod};
use policy_host_sdk::conditions::Condition;
use policy_host_sdk::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The container port the plugin holds sessions with; the admin grants it at pack time
/// (`policy-host pack --grant-exchange app`).
pub const APP_PORT: &str = "app";

/// The custom resource this plugin reconciles (the parent).
pub fn target_kind() -> KindRef {
    KindRef::namespaced(
        "plugin-template.example.com",
        "v1",
        "PluginTemplate",
        "plugintemplates",
    )
}

/// A `PluginTemplate` as the host hands it over. Only the fields the plugin reads (the
/// `crd` feature's derive makes the full `PluginTemplate` type, for the CRD).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PluginTemplateParent {
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

// Its doc comments and schema become the CRD (`crd.yaml`, generated:
// `cargo run --features crd --bin crdgen > crd.yaml`).
/// What a PluginTemplate asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    derive(kube::CustomResource),
    kube(
        group = "plugin-template.example.com",
        version = "v1",
        kind = "PluginTemplate",
        plural = "plugintemplates",
        namespaced,
        status = "PluginTemplateStatus",
        doc = "A PluginTemplate, reconciled by the plugin-template plugin."
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PluginTemplateSpec {
    /// The text the ConfigMap holds.
    #[serde(default = "default_greeting")]
    pub greeting: String,
    /// How many app Pods to run.
    #[serde(default)]
    pub replicas: u32,
    /// The app's image: a server that answers `PING` with `+PONG` on port 6379.
    #[serde(default = "default_image")]
    pub image: String,
}

impl Default for PluginTemplateSpec {
    fn default() -> Self {
        PluginTemplateSpec {
            greeting: default_greeting(),
            replicas: 0,
            image: default_image(),
        }
    }
}

fn default_greeting() -> String {
    "hello".to_owned()
}

fn default_image() -> String {
    "docker.io/library/redis:7.4".to_owned()
}

/// What the plugin reports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginTemplateStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// App Pods that answered this decision's `PING`.
    #[serde(default)]
    pub answering: u32,
    /// `Ready`: the ConfigMap holds the greeting and every app Pod answers.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The CRD, from the types above (`crdgen`, feature `crd`).
#[cfg(feature = "crd")]
pub fn custom_resource_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt as _;
    PluginTemplate::crd()
}

/// `crd.yaml` as `crdgen` writes it.
#[cfg(feature = "crd")]
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    Ok(format!(
        "# Generated from PluginTemplateSpec (src/lib.rs) by `cargo run --features crd --bin crdgen > crd.yaml`.\n# Do not edit by hand; `cargo test --features crd` checks it is current.\n{}",
        serde_yaml::to_string(&custom_resource_definition())?
    ))
}

/// The plugin.
pub struct PluginTemplatePlugin;

policy_host_sdk::export_plugin!(PluginTemplatePlugin);

/// Name of the ConfigMap a resource owns.
pub fn config_map_name(parent: &str) -> String {
    format!("{parent}-config")
}

/// The app Pod `ordinal` of `parent`.
pub fn app_pod(parent: &str, ordinal: u32, image: &str) -> serde_json::Value {
    Pod::new(&format!("{parent}-{ordinal}"))
        .label("app.kubernetes.io/instance", parent)
        .container(
            Container::new("app", image)
                // Redis answers a client from another address only outside its protected mode
                // (with no password set, it answers `-DENIED` instead of `+PONG`); the host
                // holds the sessions from the operator's address, never from loopback.
                .args(["redis-server", "--protected-mode", "no"])
                .port(APP_PORT, 6379)
                .ready_on_tcp(APP_PORT),
        )
        .build()
}

/// Whether the app in `pod` answers: one session, one `PING`, one line back. Use a session
/// for anything longer (a greeting to read first, authentication, several queries): each
/// `request` or `receive_frame` on it reads until the frame check says a frame is whole.
pub fn answers(app: &mut dyn AppCall, pod: &str) -> bool {
    let Ok(mut session) = app.connect(pod, APP_PORT) else {
        return false;
    };
    session
        .request(b"PING\r\n", frames::line)
        .is_ok_and(|reply| reply == b"+PONG\r\n")
}

impl Plugin for PluginTemplatePlugin {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "plugin-template".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            target: target_kind(),
            children: vec![children::config_map_kind(), children::pod_kind()],
            capabilities: vec![Capability::Exchange(APP_PORT.to_owned())],
            wants_finalizer: false,
        }
    }

    fn reconcile(
        observation: &Observation,
        app: &mut dyn AppCall,
    ) -> Result<Decision, PolicyError> {
        let parent: PluginTemplateParent = observation.parent()?;
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

        let pods: Vec<serde_json::Value> = (0..parent.spec.replicas)
            .map(|ordinal| app_pod(&parent.metadata.name, ordinal, &parent.spec.image))
            .collect();
        // The children wanted now: applies for these, deletes for owned ones no longer wanted
        // (the Pods of a scale-down).
        let desired = Desired::new(&[kind.clone(), children::pod_kind()])
            .want(desired)
            .want_all(pods);

        // Ready once the host's cache shows the ConfigMap with the wanted data and every app
        // Pod answers. The app is asked on every decision: the status records what it said
        // last time, the app says what is now.
        let config_map_ready = match observation.child_named(&kind, &name) {
            Some(child) => child.parse::<serde_json::Value>()?["data"] == data,
            None => false,
        };
        let running: Vec<String> = observation
            .pods()?
            .into_iter()
            .filter(|pod| pod.ready && !pod.is_gone())
            .map(|pod| pod.name.clone())
            .collect();
        let answering = running.iter().filter(|pod| answers(app, pod)).count();
        let answering = u32::try_from(answering).unwrap_or(u32::MAX);
        let mut status = parent.status.unwrap_or_default();
        status.observed_generation = parent.metadata.generation;
        status.answering = answering;
        let condition = if !config_map_ready {
            Condition::new("Ready", false, "Applying", format!("applying {name}"))
        } else if answering < parent.spec.replicas {
            Condition::new(
                "Ready",
                false,
                "AppStarting",
                format!("{answering} of {} app Pods answer", parent.spec.replicas),
            )
        } else {
            Condition::new(
                "Ready",
                true,
                "ConfigMapReady",
                format!("{name} holds the greeting"),
            )
        };
        set_condition(
            &mut status.conditions,
            condition.observed(parent.metadata.generation),
            observation.now,
        );

        // Apply the whole desired objects every time: server-side apply makes a repeat a no-op.
        let mut decision = Decision::nothing();
        decision.actions = desired.actions(observation);
        let decision = decision.with(Action::set_status(&status)?);
        Ok(if answering < parent.spec.replicas {
            // The host wakes a plugin on Kubernetes changes only: ask the app again soon.
            decision.requeue_after(std::time::Duration::from_secs(5))
        } else {
            decision
        })
    }
}

#[cfg(test)]
mod tests {
    use policy_host_sdk::testing::{Harness, ScriptedAppCall, observation};

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
    fn describe_declares_the_parent_its_children_and_the_app_port() {
        let info = PluginTemplatePlugin::describe();
        assert_eq!(info.target, target_kind());
        assert_eq!(
            info.children,
            vec![children::config_map_kind(), children::pod_kind()]
        );
        assert_eq!(
            info.capabilities,
            vec![Capability::Exchange(APP_PORT.to_owned())]
        );
    }

    /// An app Pod as the host's cache shows it once the kubelet runs it.
    fn running(ordinal: u32) -> serde_json::Value {
        let mut pod = app_pod("demo", ordinal, "redis");
        pod["status"] = json!({
            "phase": "Running",
            "podIP": format!("10.0.0.{ordinal}"),
            "conditions": [{ "type": "Ready", "status": "True" }],
        });
        pod
    }

    fn config_map(greeting: &str) -> serde_json::Value {
        children::child_object(
            &children::config_map_kind(),
            "demo-config",
            &[],
            json!({ "data": { "greeting": greeting } }),
        )
    }

    /// A fake app whose Pods answer `PING` (one session each), except those in `silent`.
    fn app(pods: &[&str], silent: &[&str]) -> ScriptedAppCall {
        pods.iter().fold(ScriptedAppCall::new(), |app, pod| {
            let reply: &[u8] = if silent.contains(pod) {
                b"-LOADING\r\n"
            } else {
                b"+PONG\r\n"
            };
            app.answers(pod, APP_PORT, "PING\r\n", reply)
        })
    }

    #[test]
    fn app_pods_table() {
        // (situation, replicas, running pods, fake app, Ready reason, Pods applied, deleted)
        let rows = [
            (
                "every app Pod answers over its session",
                2,
                vec![running(0), running(1)],
                app(&["demo-0", "demo-1"], &[]),
                "ConfigMapReady",
                vec!["demo-0", "demo-1"],
                vec![],
            ),
            (
                "a Pod that answers something else is not counted",
                2,
                vec![running(0), running(1)],
                app(&["demo-0", "demo-1"], &["demo-1"]),
                "AppStarting",
                vec!["demo-0", "demo-1"],
                vec![],
            ),
            (
                "a Pod that cannot be reached is not counted",
                1,
                vec![running(0)],
                ScriptedAppCall::new(),
                "AppStarting",
                vec!["demo-0"],
                vec![],
            ),
            (
                "a scale-down deletes the Pods no longer wanted",
                1,
                vec![running(0), running(1)],
                app(&["demo-0", "demo-1"], &[]),
                "ConfigMapReady",
                vec!["demo-0"],
                vec!["demo-1"],
            ),
        ];
        for (situation, replicas, pods, app, reason, applied, deleted) in rows {
            let observed = pods
                .into_iter()
                .fold(
                    observation(parent(json!({ "greeting": "hi", "replicas": replicas })))
                        .child(&children::config_map_kind(), config_map("hi")),
                    |o, pod| o.child(&children::pod_kind(), pod),
                )
                .build();
            let mut harness = Harness::<PluginTemplatePlugin>::with_app(app);
            let decision = harness
                .reconcile(&observed)
                .unwrap_or_else(|e| panic!("{situation}: refused: {e}"));
            let status = decision.status().cloned().unwrap_or_default();
            assert_eq!(status["conditions"][0]["reason"], reason, "{situation}");
            for pod in applied {
                assert!(decision.applied("Pod", pod).is_some(), "{situation}: {pod}");
            }
            assert_eq!(decision.deleted("Pod"), deleted, "{situation}");
        }
    }

    /// The responder file `policy-host simulate --responses responses.json` reads.
    #[test]
    fn the_responder_file_answers_the_sessions() {
        let app = ScriptedAppCall::from_responses(include_str!("../responses.json"))
            .expect("responses.json parses");
        let observed = observation(parent(json!({ "greeting": "hi", "replicas": 1 })))
            .child(&children::config_map_kind(), config_map("hi"))
            .child(&children::pod_kind(), running(0))
            .build();
        let decision = Harness::<PluginTemplatePlugin>::with_app(app)
            .reconcile(&observed)
            .expect("decides");
        let status = decision.status().cloned().unwrap_or_default();
        assert_eq!(status["answering"], 1);
        assert_eq!(status["conditions"][0]["status"], "True");
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
