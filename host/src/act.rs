//! Act: turns a plugin's decision into Kubernetes writes — server-side apply of children with
//! the host's owner reference, deletes of children the parent controls, status through the
//! status subresource, and Events.
//!
//! The host, not the plugin, decides ownership: every applied child gets the parent as its
//! controller and the host's policy label, and a delete is refused unless the parent already
//! controls the object. A plugin therefore cannot adopt or remove objects it does not own.

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::contract::{Action, Event, EventType, KindRef, PolicyInfo};
use crate::observe::Observed;

/// An object a plugin asked to apply, with what identifies it.
pub struct AppliedObject {
    /// The object.
    pub object: Value,
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.name`, never empty.
    pub name: String,
}

impl AppliedObject {
    /// Parses an `apply` action's JSON; the error says what is missing.
    pub fn parse(json: &str) -> Result<Self, String> {
        let object: Value = serde_json::from_str(json)
            .map_err(|e| format!("an applied object is not valid JSON: {e}"))?;
        let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
        let (api_version, kind) = (text(&object["apiVersion"]), text(&object["kind"]));
        let name = text(&object["metadata"]["name"]);
        if name.is_empty() {
            return Err(format!("an applied {kind} has no metadata.name"));
        }
        Ok(Self {
            object,
            api_version,
            kind,
            name,
        })
    }
}

/// The field manager of every server-side apply the host makes.
pub const FIELD_MANAGER: &str = "policy-host";

/// The label the host puts on every child it applies: the name of the policy that owns it.
/// Child watches select on it.
pub const POLICY_LABEL: &str = "policy-host.io/policy";

/// Why a decision could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    /// The plugin asked for something the host will not do.
    #[error("plugin `{plugin}` asked for an action the host refuses: {message}; fix the plugin")]
    Refused {
        /// Plugin label.
        plugin: String,
        /// What was wrong.
        message: String,
    },
    /// The API server refused or failed a write.
    #[error("{what} failed: {}", api_error_text(source))]
    Api {
        /// The write.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// The API server's own message for an API error (not the Debug dump of its Status).
pub fn api_error_text(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

impl ActError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ActError::Refused { .. } => "ActionRefused",
            ActError::Api { .. } => "ApiWriteFailed",
        }
    }
}

/// What the executor needs to write for one policy.
#[derive(Clone)]
pub struct Executor {
    client: Client,
    recorder: Recorder,
    plugin_label: String,
    info: PolicyInfo,
    parent_resource: ApiResource,
}

/// Eight hex digits identifying a text.
/// An Event reason as the API accepts it: at most 128 bytes (the API counts bytes, not
/// characters), cut at a character boundary.
fn event_reason(reason: &str) -> String {
    reason[..reason.floor_char_boundary(128)].to_owned()
}

fn fingerprint(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The kube-rs address of a declared kind.
pub fn api_resource(kind: &KindRef) -> ApiResource {
    ApiResource {
        group: kind.group.clone(),
        version: kind.version.clone(),
        api_version: kind.api_version(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
    }
}

impl Executor {
    /// An executor for the plugin described by `info`.
    pub fn new(client: Client, plugin_label: &str, info: &PolicyInfo) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            plugin_label: plugin_label.to_string(),
            parent_resource: api_resource(&info.target),
            info: info.clone(),
        }
    }

    /// Carries out `actions` in order, stopping at the first failure.
    pub async fn apply_decision(
        &self,
        parent: &DynamicObject,
        observed: &Observed,
        actions: Vec<Action>,
    ) -> Result<(), ActError> {
        for action in actions {
            match action {
                Action::Apply(json) => self.apply_child(parent, &json).await?,
                Action::Delete(target) => {
                    self.delete_child(parent, observed, &target.kind, &target.name)
                        .await?
                }
                Action::SetStatus(json) => self.set_status(parent, &json).await?,
                Action::RecordEvent(event) => self.record_event(parent, event).await?,
            }
        }
        Ok(())
    }

    fn refused(&self, message: String) -> ActError {
        ActError::Refused {
            plugin: self.plugin_label.clone(),
            message,
        }
    }

    fn declared(&self, api_version: &str, kind: &str) -> Option<&KindRef> {
        self.info
            .children
            .iter()
            .find(|k| k.matches(api_version, kind))
    }

    fn namespace(&self, parent: &DynamicObject) -> Result<String, ActError> {
        parent
            .namespace()
            .ok_or_else(|| self.refused("cluster-scoped parents are not supported yet".into()))
    }

    /// Server-side applies one child with the parent as its controller.
    async fn apply_child(&self, parent: &DynamicObject, json: &str) -> Result<(), ActError> {
        let AppliedObject {
            mut object,
            api_version,
            kind: kind_name,
            name,
        } = AppliedObject::parse(json).map_err(|e| self.refused(e))?;
        let kind = self.declared(&api_version, &kind_name).cloned().ok_or_else(|| {
            self.refused(format!(
                "it applied {api_version}/{kind_name} `{name}`, a kind it did not declare as a child"
            ))
        })?;
        let namespace = self.namespace(parent)?;
        let owner = parent
            .controller_owner_ref(&self.parent_resource)
            .ok_or_else(|| self.refused("the parent has no uid".into()))?;
        let metadata = object
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| self.refused(format!("{kind_name} `{name}` has no metadata object")))?;
        metadata.insert("namespace".into(), json!(namespace));
        metadata.insert("ownerReferences".into(), json!([owner]));
        let labels = metadata
            .entry("labels")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| self.refused(format!("{kind_name} `{name}` has non-object labels")))?;
        labels.insert(POLICY_LABEL.into(), json!(self.info.name));

        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &api_resource(&kind));
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(|source| ActError::Api {
            what: format!("applying {kind_name} {namespace}/{name}"),
            source,
        })?;
        Ok(())
    }

    /// Deletes a child, only if the parent controls it; an already-gone child is fine.
    async fn delete_child(
        &self,
        parent: &DynamicObject,
        observed: &Observed,
        kind: &KindRef,
        name: &str,
    ) -> Result<(), ActError> {
        let declared = self
            .declared(&kind.api_version(), &kind.kind)
            .cloned()
            .ok_or_else(|| {
                self.refused(format!(
                    "it deleted {kind} `{name}`, a kind it did not declare as a child"
                ))
            })?;
        let controlled = observed
            .owned
            .get(&declared.to_string())
            .is_some_and(|names| names.iter().any(|n| n == name));
        if !controlled {
            return Err(self.refused(format!(
                "it deleted {kind} `{name}`, which its parent does not control"
            )));
        }
        let namespace = self.namespace(parent)?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &api_resource(&declared));
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) => Err(ActError::Api {
                what: format!("deleting {} {namespace}/{name}", declared.kind),
                source,
            }),
        }
    }

    /// Replaces the parent's status (server-side apply on the status subresource).
    async fn set_status(&self, parent: &DynamicObject, json: &str) -> Result<(), ActError> {
        let status: Value = serde_json::from_str(json)
            .map_err(|e| self.refused(format!("its status is not valid JSON: {e}")))?;
        if !status.is_object() {
            return Err(self.refused("its status is not a JSON object".into()));
        }
        if parent.data.get("status") == Some(&status) {
            return Ok(());
        }
        let namespace = self.namespace(parent)?;
        let name = parent.name_any();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &self.parent_resource);
        let patch = json!({
            "apiVersion": self.parent_resource.api_version,
            "kind": self.parent_resource.kind,
            "status": status,
        });
        api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
            .await
            .map_err(|source| ActError::Api {
                what: format!(
                    "setting the status of {} {namespace}/{name} (does its CRD enable the status subresource?)",
                    self.parent_resource.kind
                ),
                source,
            })?;
        Ok(())
    }

    /// Records an Event on the parent.
    pub async fn record_event(&self, parent: &DynamicObject, event: Event) -> Result<(), ActError> {
        let mut note = event.message;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let reason = event_reason(&event.reason);
        let kube_event = KubeEvent {
            type_: match event.event_type {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            // kube's Recorder folds events with the same (type, reason, action, object) into
            // one series and keeps only the first note; a fingerprint of the note in `action`
            // keeps distinct messages distinct ("added member -1", then "-2") while identical
            // repeats (a failure retried with backoff) still fold into one series.
            action: format!(
                "{}-{}",
                &reason[..reason.floor_char_boundary(100)],
                fingerprint(&note)
            ),
            reason,
            note: Some(note),
            secondary: None,
        };
        let reference = parent.object_ref(&self.parent_resource);
        self.recorder
            .publish(&kube_event, &reference)
            .await
            .map_err(|source| ActError::Api {
                what: format!("recording an Event on {}", parent.name_any()),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_reasons_are_bounded_in_bytes_not_characters() {
        let rows = [
            ("ascii under the limit", "Reconciled".to_owned()),
            ("ascii over the limit", "R".repeat(300)),
            ("two-byte characters over the limit", "é".repeat(100)),
            ("a cut inside a character", format!("a{}", "é".repeat(100))),
        ];
        for (situation, reason) in rows {
            let cut = event_reason(&reason);
            assert!(cut.len() <= 128, "{situation}: {} bytes", cut.len());
            assert!(reason.starts_with(&cut), "{situation}");
            assert!(
                cut.len() >= reason.len().min(127),
                "{situation}: cut too much"
            );
        }
    }
}
