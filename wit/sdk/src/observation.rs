//! Typed access to an [`Observation`]: the parent as the plugin's own custom resource type,
//! the children of one kind, and the parent's identity.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::contract::{Child, KindRef, Observation, PolicyError};

impl Observation {
    /// The parent parsed as the plugin's type, typically a `kube::CustomResource` or a
    /// plain struct with `metadata`, `spec` and `status` fields. A parent that does not
    /// parse is an `InvalidParent` error naming the field serde rejected.
    pub fn parent<T: DeserializeOwned>(&self) -> Result<T, PolicyError> {
        serde_json::from_str(&self.parent).map_err(|e| {
            PolicyError::new(
                "InvalidParent",
                format!("the custom resource does not match the plugin's schema: {e}"),
            )
        })
    }

    /// The parent as untyped JSON.
    pub fn parent_json(&self) -> Result<Value, PolicyError> {
        self.parent::<Value>()
    }

    /// `metadata.name` of the parent.
    pub fn parent_name(&self) -> Result<String, PolicyError> {
        self.parent_json()?["metadata"]["name"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| PolicyError::new("InvalidParent", "the parent has no metadata.name"))
    }

    /// `metadata.generation` of the parent, for `observedGeneration` in status.
    pub fn parent_generation(&self) -> Option<i64> {
        self.parent_json().ok()?["metadata"]["generation"].as_i64()
    }

    /// The children of one declared kind (the version is ignored: the host serves each
    /// child kind at the version it was declared with).
    pub fn children_of_kind<'a>(
        &'a self,
        kind: &KindRef,
    ) -> impl Iterator<Item = &'a Child> + use<'a> {
        let (group, kind) = (kind.group.clone(), kind.kind.clone());
        self.children
            .iter()
            .filter(move |c| c.kind.is(&group, &kind))
    }

    /// The children of one kind, parsed as `T` (e.g. `k8s_openapi::api::core::v1::Pod`, or
    /// a small struct with only the fields the plugin reads).
    pub fn children_as<T: DeserializeOwned>(&self, kind: &KindRef) -> Result<Vec<T>, PolicyError> {
        self.children_of_kind(kind).map(Child::parse).collect()
    }

    /// The child of `kind` named `name`, if the host saw one.
    pub fn child_named(&self, kind: &KindRef, name: &str) -> Option<&Child> {
        self.children_of_kind(kind)
            .find(|c| c.name().as_deref() == Some(name))
    }
}

impl Child {
    /// The object parsed as `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, PolicyError> {
        serde_json::from_str(&self.object).map_err(|e| {
            PolicyError::new(
                "InvalidChild",
                format!(
                    "a {} does not parse as the plugin expects: {e}",
                    self.kind.kind
                ),
            )
        })
    }

    /// `metadata.name`, if the object has one (read alone from the text, building no tree).
    pub fn name(&self) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Named {
            metadata: Meta,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            name: Option<String>,
        }
        serde_json::from_str::<Named>(&self.object)
            .ok()?
            .metadata
            .name
    }
}
