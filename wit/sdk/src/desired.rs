//! The children a decision wants, as a set: [`Desired`] turns it into an apply for each wanted
//! child and a delete for each observed child of a managed kind outside it, so a plugin never
//! writes its delete lists by hand (Metacontroller's desired children, operator-rs'
//! `ClusterResources`).
//!
//! The observation holds only the children the parent controls, so nothing else can be
//! deleted; which kinds are pruned is still the author's choice ([`Desired::new`]), since a
//! plugin may keep children it no longer wants on purpose (a scaled-down member's claim, a
//! finished backup's Pod). [`Desired::keep`] spares one child of a managed kind.

use serde_json::Value;

use crate::contract::{Action, KindRef, Observation};

/// The children wanted now, and the kinds whose other children go.
#[derive(Clone, Debug, Default)]
pub struct Desired {
    managed: Vec<KindRef>,
    wanted: Vec<Value>,
    kept: Vec<(KindRef, String)>,
}

impl Desired {
    /// An empty set that prunes children of `managed` kinds (those the plugin declared and
    /// owns entirely).
    pub fn new(managed: &[KindRef]) -> Self {
        Desired {
            managed: managed.to_vec(),
            ..Desired::default()
        }
    }

    /// Wants `object` (a whole child, with `apiVersion`, `kind` and `metadata.name`, as
    /// [`crate::children`] builds it). Wanting the same kind and name twice keeps the last.
    pub fn want(mut self, object: Value) -> Self {
        let key = identity(&object);
        self.wanted.retain(|o| identity(o) != key);
        self.wanted.push(object);
        self
    }

    /// Wants every object of `objects`.
    pub fn want_all(self, objects: impl IntoIterator<Item = Value>) -> Self {
        objects.into_iter().fold(self, Desired::want)
    }

    /// Leaves the observed child `name` of `kind` alone: neither applied nor deleted.
    pub fn keep(mut self, kind: &KindRef, name: &str) -> Self {
        self.kept.push((kind.clone(), name.to_owned()));
        self
    }

    /// True when a child of `kind` named `name` is wanted.
    pub fn wants(&self, kind: &KindRef, name: &str) -> bool {
        self.wanted.iter().any(|o| is(o, kind, name))
    }

    /// The deletes: every observed child of a managed kind that is neither wanted nor kept,
    /// nor already being deleted; by kind as [`Desired::new`] listed them, then by name.
    pub fn deletes(&self, observation: &Observation) -> Vec<Action> {
        let mut deletes = Vec::new();
        for kind in &self.managed {
            let mut names: Vec<String> = observation
                .children_of_kind(kind)
                .filter(|child| {
                    child
                        .parse::<Value>()
                        .is_ok_and(|o| o["metadata"]["deletionTimestamp"].is_null())
                })
                .filter_map(|child| child.name())
                .filter(|name| {
                    !self.wants(kind, name)
                        && !self
                            .kept
                            .iter()
                            .any(|(k, n)| k.is(&kind.group, &kind.kind) && n == name)
                })
                .collect();
            names.sort();
            deletes.extend(names.into_iter().map(|name| Action::delete(kind, name)));
        }
        deletes
    }

    /// The applies, in the order the children were wanted.
    pub fn applies(&self) -> Vec<Action> {
        self.wanted.iter().cloned().map(Action::Apply).collect()
    }

    /// Applies, then deletes: a replacement exists before what it replaces goes. Order them
    /// otherwise with [`Desired::applies`] and [`Desired::deletes`].
    pub fn actions(&self, observation: &Observation) -> Vec<Action> {
        let mut actions = self.applies();
        actions.extend(self.deletes(observation));
        actions
    }
}

/// `(apiVersion, kind, name)` of an object.
fn identity(object: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&object["apiVersion"]),
        text(&object["kind"]),
        text(&object["metadata"]["name"]),
    )
}

fn is(object: &Value, kind: &KindRef, name: &str) -> bool {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    group == kind.group
        && object["kind"] == kind.kind.as_str()
        && object["metadata"]["name"] == name
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::children::{child_object, config_map_kind, pod_kind, pvc_kind};
    use crate::testing::observation;

    fn pod(name: &str) -> Value {
        child_object(&pod_kind(), name, &[], json!({}))
    }

    fn terminating_pod(name: &str) -> Value {
        let mut pod = pod(name);
        pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        pod
    }

    fn deleted(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { kind, name } => Some(format!("{}/{name}", kind.kind)),
                _ => None,
            })
            .collect()
    }

    fn applied(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Apply(o) => Some(format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )),
                _ => None,
            })
            .collect()
    }

    /// A row: situation, observed children, desired set, applies, deletes.
    type Row = (
        &'static str,
        Vec<(KindRef, Value)>,
        Desired,
        &'static [&'static str],
        &'static [&'static str],
    );

    #[test]
    fn the_desired_set_table() {
        let parent = json!({ "metadata": { "name": "db" } });
        let rows: [Row; 6] = [
            (
                "a scale-down from three to two deletes the third pod",
                vec![
                    (pod_kind(), pod("db-0")),
                    (pod_kind(), pod("db-1")),
                    (pod_kind(), pod("db-2")),
                ],
                Desired::new(&[pod_kind()]).want_all([pod("db-0"), pod("db-1")]),
                &["Pod/db-0", "Pod/db-1"],
                &["Pod/db-2"],
            ),
            (
                "a kind that is not managed is never pruned",
                vec![
                    (pod_kind(), pod("db-2")),
                    (
                        pvc_kind(),
                        child_object(&pvc_kind(), "data-db-2", &[], json!({})),
                    ),
                ],
                Desired::new(&[pod_kind()]),
                &[],
                &["Pod/db-2"],
            ),
            (
                "a kept child is neither applied nor deleted",
                vec![(pod_kind(), pod("backup-1")), (pod_kind(), pod("db-0"))],
                Desired::new(&[pod_kind()])
                    .want(pod("db-0"))
                    .keep(&pod_kind(), "backup-1"),
                &["Pod/db-0"],
                &[],
            ),
            (
                "a child already being deleted is not deleted again",
                vec![(pod_kind(), terminating_pod("db-1"))],
                Desired::new(&[pod_kind()]),
                &[],
                &[],
            ),
            (
                "a child of the same name but another kind is not the wanted one",
                vec![(
                    config_map_kind(),
                    child_object(&config_map_kind(), "db-0", &[], json!({})),
                )],
                Desired::new(&[config_map_kind()]).want(pod("db-0")),
                &["Pod/db-0"],
                &["ConfigMap/db-0"],
            ),
            (
                "wanting a child twice applies it once, as last wanted",
                vec![],
                Desired::new(&[pod_kind()])
                    .want(pod("db-0"))
                    .want(pod("db-0")),
                &["Pod/db-0"],
                &[],
            ),
        ];
        for (situation, children, desired, applies, deletes) in rows {
            let observed = children
                .into_iter()
                .fold(observation(parent.clone()), |o, (kind, object)| {
                    o.child(&kind, object)
                })
                .build();
            let actions = desired.actions(&observed);
            assert_eq!(applied(&actions), applies, "{situation}");
            assert_eq!(deleted(&actions), deletes, "{situation}");
        }
    }

    #[test]
    fn applies_come_before_deletes() {
        let observed = observation(json!({}))
            .child(&pod_kind(), pod("old"))
            .build();
        let actions = Desired::new(&[pod_kind()])
            .want(pod("new"))
            .actions(&observed);
        assert!(matches!(
            actions.as_slice(),
            [Action::Apply(_), Action::Delete { .. }]
        ));
    }
}
