//! The form a child is cached in: its metadata typed, and everything else in the object as the
//! compact JSON text the plugin is shown, instead of a `serde_json::Value` tree per object.
//!
//! The host reads a child's metadata (name, namespace, uid, controller reference: the owner
//! index, the namespace check, the uids deletes carry) and, for Pods, a handful of fields
//! (IP, ports, phase) when it builds the app-call scope; the plugin reads the object as JSON
//! text. A `Value` tree spends a heap allocation on every string, map and array and has to be
//! walked to be written out again on every observation; text is one allocation per object and
//! is copied into the observation as it is (BENCHMARKS.md, "The compact child cache", measures
//! this form against the tree, typed objects, and the whole object as text).
//!
//! The text is made by serde_json from the same `Value` a `DynamicObject` would hold, and
//! [`CachedChild::to_json`] writes the object out exactly as serializing that `DynamicObject`
//! would, byte for byte: the plugin sees what it saw before.

use std::borrow::Cow;

use kube::api::{ApiResource, DynamicObject, ObjectMeta, TypeMeta};
use kube::core::{DynamicResourceScope, Resource};
use serde::{Deserialize, Deserializer, Serialize};

/// One cached child: typed metadata for the host, the rest as JSON text for the plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedChild {
    /// `apiVersion` and `kind`, when the API server sent them.
    pub types: Option<TypeMeta>,
    /// The object's metadata.
    pub metadata: ObjectMeta,
    /// Every other top-level field (`spec`, `status`, `data`…) as a compact JSON object, keys in
    /// the order serde_json writes a `Value` map (sorted).
    body: Box<str>,
}

impl CachedChild {
    /// The object as the plugin sees it: what serializing the `DynamicObject` it was made from
    /// would write.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        // `apiVersion`, `kind` and `metadata` come first, then the body's fields, as serde
        // writes a `DynamicObject` (its flattened types, its metadata, its flattened data).
        let head = serde_json::to_string(&Head {
            types: &self.types,
            metadata: &self.metadata,
        })?;
        let fields = &self.body[1..self.body.len() - 1];
        if fields.is_empty() {
            return Ok(head);
        }
        let mut json = String::with_capacity(head.len() + fields.len() + 1);
        json.push_str(&head[..head.len() - 1]);
        json.push(',');
        json.push_str(fields);
        json.push('}');
        Ok(json)
    }

    /// Every top-level field other than `apiVersion`, `kind` and `metadata`, as one JSON
    /// object: parse the fields the host needs from it (see `observe`'s pod endpoint).
    pub fn body(&self) -> &str {
        &self.body
    }
}

/// The fields a `DynamicObject` writes before its data, borrowed: serde writes this exactly as
/// it writes a `DynamicObject` whose data has no fields.
#[derive(Serialize)]
struct Head<'a> {
    #[serde(flatten)]
    types: &'a Option<TypeMeta>,
    metadata: &'a ObjectMeta,
}

impl From<DynamicObject> for CachedChild {
    fn from(object: DynamicObject) -> Self {
        let body = match &object.data {
            // Writing a `Value` out to a `String` cannot fail: its map keys are strings.
            serde_json::Value::Object(_) => serde_json::to_string(&object.data).ok(),
            // A `DynamicObject` built by hand may hold `null` here; nothing comes from the API
            // server that way, and it writes out no fields.
            _ => None,
        };
        Self {
            types: object.types,
            metadata: object.metadata,
            body: body.unwrap_or_else(|| "{}".to_owned()).into_boxed_str(),
        }
    }
}

/// Read as a `DynamicObject` is (the watcher's lists buffer their items, so a borrowed raw
/// value cannot be taken from the input), then kept as text: the tree lives only while one
/// object is read.
impl<'de> Deserialize<'de> for CachedChild {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        DynamicObject::deserialize(deserializer).map(Self::from)
    }
}

/// Addressed as a `DynamicObject` is, by the `ApiResource` of its kind: watchers, stores and
/// the controller's owner triggers take it as they take a `DynamicObject`.
impl Resource for CachedChild {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row: an object as the API server could send it. What the plugin is shown from the
    /// compact form is what it was shown from the `DynamicObject`, byte for byte.
    #[test]
    fn the_plugin_sees_the_bytes_a_dynamic_object_gives() {
        let rows = [
            (
                "a pod with spec and status, fields out of order, unicode and escapes",
                r#"{"kind":"Pod","status":{"podIP":"10.0.0.7","phase":"Running"},"apiVersion":"v1",
                   "metadata":{"name":"db-0","namespace":"ns","uid":"u1","labels":{"b":"2","a":"1"},
                     "annotations":{"note":"é \"quoted\" \\ \n"},
                     "ownerReferences":[{"apiVersion":"x/v1","kind":"P","name":"p","uid":"pu","controller":true}]},
                   "spec":{"containers":[{"name":"etcd","ports":[{"containerPort":2379}]}],"z":1.5e3,"a":null}}"#,
            ),
            (
                "a config map: data, no spec or status",
                r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"},"immutable":true}"#,
            ),
            (
                "metadata only",
                r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"empty"}}"#,
            ),
            (
                "no apiVersion or kind (a list item of a built-in kind)",
                r#"{"metadata":{"name":"bare","namespace":"ns"},"spec":{"x":[1,2,{}]}}"#,
            ),
            (
                "big integers and floats kept as serde_json writes them",
                r#"{"apiVersion":"v1","kind":"X","metadata":{"name":"n"},"spec":{"big":18446744073709551615,"neg":-9223372036854775808,"f":0.1}}"#,
            ),
        ];
        for (situation, json) in rows {
            let dynamic: DynamicObject = serde_json::from_str(json).expect(situation);
            let cached: CachedChild = serde_json::from_str(json).expect(situation);
            let want = serde_json::to_string(&dynamic).expect(situation);
            assert_eq!(cached.to_json().expect(situation), want, "{situation}");
            assert_eq!(
                CachedChild::from(dynamic).to_json().expect(situation),
                want,
                "{situation}: converted"
            );
        }
    }

    /// The metadata the host reads is typed, as a `DynamicObject`'s is, and the body holds
    /// neither it nor the type fields.
    #[test]
    fn metadata_is_typed_and_not_kept_twice() {
        let cached: CachedChild = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"db-0","namespace":"ns","uid":"u1"},"spec":{"a":1}}"#,
        )
        .expect("a pod");
        assert_eq!(cached.metadata.name.as_deref(), Some("db-0"));
        assert_eq!(cached.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(cached.types.as_ref().map(|t| t.kind.as_str()), Some("Pod"));
        assert_eq!(cached.body(), r#"{"spec":{"a":1}}"#);
    }

    /// A watch event carries its object inside an adjacently tagged enum and a list buffers its
    /// items: the compact form reads through both, as the watcher does.
    #[test]
    fn reads_from_watch_events_and_lists() {
        let event: kube::api::WatchEvent<CachedChild> = serde_json::from_str(
            r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","resourceVersion":"7"},"spec":{"n":1}}}"#,
        )
        .expect("a watch event");
        let kube::api::WatchEvent::Added(added) = event else {
            panic!("an added event");
        };
        assert_eq!(added.body(), r#"{"spec":{"n":1}}"#);
        let list: kube::core::ObjectList<CachedChild> = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"9"},
                "items":[{"metadata":{"name":"a"},"status":{"phase":"Running"}}]}"#,
        )
        .expect("a list");
        let bodies: Vec<&str> = list.items.iter().map(CachedChild::body).collect();
        assert_eq!(bodies, [r#"{"status":{"phase":"Running"}}"#]);
    }
}
