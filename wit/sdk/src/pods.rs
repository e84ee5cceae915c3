//! Observed Pods as a plugin reads them: phase, readiness (and since when), deletion, labels
//! and annotations, and each container's image (in the spec and as running), restarts,
//! start time and waiting reason, without the plugin declaring serde types for the Pod
//! schema. For a stateful app these are what most decisions turn on (is this member up, gone
//! for good, crash-looping for a while, restarted on the new image).

use std::cell::OnceCell;
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::children::pod_kind;
use crate::contract::{Child, Observation, PolicyError};

/// A Pod child as observed. The fields and accessors are read straight from the Pod's JSON
/// text into small typed structs (serde skips everything they do not name, building no
/// tree); [`ObservedPod::object`] parses the whole Pod only when a plugin asks for it (for
/// example to re-apply the Pod with one field changed). Parsing every Pod into a
/// `serde_json::Value` tree was most of a decision's cost (BENCHMARKS.md, issue 17).
#[derive(Clone, Debug)]
pub struct ObservedPod {
    /// `metadata.name`.
    pub name: String,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`), empty if not reported.
    pub phase: String,
    /// Whether the `Ready` condition is `True`.
    pub ready: bool,
    /// When the `Ready` condition last changed (`lastTransitionTime`, RFC 3339), if reported.
    ready_changed_at: Option<String>,
    /// Whether the Pod is being deleted (`metadata.deletionTimestamp` set).
    pub terminating: bool,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    containers: Vec<ContainerFields>,
    container_statuses: Vec<ContainerStatusFields>,
    init_container_statuses: Vec<ContainerStatusFields>,
    /// The Pod as the host handed it over.
    text: String,
    /// `text` parsed, on first use.
    object: OnceCell<Value>,
}

/// Two observations of a Pod are equal when the Pod's text is (everything else is read from
/// it; whether the whole Pod was parsed yet does not count).
impl PartialEq for ObservedPod {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for ObservedPod {}

/// The parts of a Pod that [`ObservedPod`] reads, each optional: what the API server
/// leaves out (a Pod not yet scheduled has no status) reads as empty.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodFields {
    metadata: MetaFields,
    spec: SpecFields,
    status: StatusFields,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct MetaFields {
    name: String,
    deletion_timestamp: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SpecFields {
    containers: Vec<ContainerFields>,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default)]
struct ContainerFields {
    name: String,
    image: Option<String>,
    args: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct StatusFields {
    phase: String,
    conditions: Vec<ConditionFields>,
    container_statuses: Vec<ContainerStatusFields>,
    init_container_statuses: Vec<ContainerStatusFields>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ConditionFields {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    last_transition_time: Option<String>,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default, rename_all = "camelCase")]
struct ContainerStatusFields {
    name: String,
    restart_count: i64,
    state: StateFields,
    image: String,
    #[serde(rename = "imageID")]
    image_id: String,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default)]
struct StateFields {
    waiting: Option<WaitingFields>,
    running: Option<RunningFields>,
    terminated: Option<TerminatedFields>,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default, rename_all = "camelCase")]
struct TerminatedFields {
    message: Option<String>,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default, rename_all = "camelCase")]
struct RunningFields {
    started_at: Option<String>,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default)]
struct WaitingFields {
    reason: Option<String>,
}

impl ObservedPod {
    /// Reads a Pod child. A child that is not a Pod object is an `InvalidChild` error (the
    /// host hands over what the API server returned, so this is a host bug).
    pub fn read(child: &Child) -> Result<ObservedPod, PolicyError> {
        let fields: PodFields = serde_json::from_str(&child.object).map_err(|e| {
            PolicyError::new(
                "InvalidChild",
                format!("a Pod child is not a Pod object ({e}); this is a host bug"),
            )
        })?;
        let ready_condition = fields.status.conditions.iter().find(|c| c.type_ == "Ready");
        Ok(ObservedPod {
            name: fields.metadata.name,
            phase: fields.status.phase,
            ready: ready_condition.is_some_and(|c| c.status == "True"),
            ready_changed_at: ready_condition.and_then(|c| c.last_transition_time.clone()),
            terminating: fields.metadata.deletion_timestamp.is_some(),
            labels: fields.metadata.labels,
            annotations: fields.metadata.annotations,
            containers: fields.spec.containers,
            container_statuses: fields.status.container_statuses,
            init_container_statuses: fields.status.init_container_statuses,
            text: child.object.clone(),
            object: OnceCell::new(),
        })
    }

    /// The whole Pod, parsed on first use: for what the accessors do not cover.
    pub fn object(&self) -> &Value {
        self.object.get_or_init(|| {
            // `read` parsed this text already, so it is JSON; `Null` is unreachable.
            serde_json::from_str(&self.text).unwrap_or(Value::Null)
        })
    }

    /// A Pod that will not run again by itself: it is being deleted, or it has ended
    /// (`Failed`, or `Succeeded` for a Pod whose containers exit).
    pub fn is_gone(&self) -> bool {
        self.terminating || self.phase == "Failed" || self.phase == "Succeeded"
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The value of annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    /// The image of container `container` in the Pod's spec.
    pub fn image(&self, container: &str) -> Option<&str> {
        self.containers
            .iter()
            .find(|c| c.name == container)?
            .image
            .as_deref()
    }

    /// The arguments of container `container` in the Pod's spec (empty for none, or no such
    /// container): how a plugin tells which flags a running member was started with.
    pub fn args(&self, container: &str) -> &[String] {
        self.containers
            .iter()
            .find(|c| c.name == container)
            .map_or(&[], |c| c.args.as_slice())
    }

    /// How many times container `container` restarted (0 before it is reported).
    pub fn restarts(&self, container: &str) -> i64 {
        self.container_status(container)
            .map_or(0, |s| s.restart_count)
    }

    /// Why container `container` is waiting, e.g. `CrashLoopBackOff` for a container that
    /// keeps exiting; `None` while it runs.
    pub fn waiting_reason(&self, container: &str) -> Option<&str> {
        self.container_status(container)?
            .state
            .waiting
            .as_ref()?
            .reason
            .as_deref()
    }

    /// Why init container `container` is waiting, e.g. `CrashLoopBackOff` for a step that
    /// keeps failing (the Pod's main containers never start); `None` while it runs or once it
    /// is done.
    pub fn init_waiting_reason(&self, container: &str) -> Option<&str> {
        self.init_container_statuses
            .iter()
            .find(|s| s.name == container)?
            .state
            .waiting
            .as_ref()?
            .reason
            .as_deref()
    }

    /// When the `Ready` condition last changed (its `lastTransitionTime`, RFC 3339): since
    /// when the Pod has been Ready, or not Ready. `None` before the kubelet reported it.
    pub fn ready_changed_at(&self) -> Option<&str> {
        self.ready_changed_at.as_deref()
    }

    /// The image container `container` runs, as the kubelet reports it (`status.image`):
    /// after a change of the spec's image, the old one until the container restarted.
    /// Runtimes may report a normalized name (`docker.io/library/busybox:1` for `busybox:1`).
    pub fn running_image(&self, container: &str) -> Option<&str> {
        Some(self.container_status(container)?.image.as_str()).filter(|i| !i.is_empty())
    }

    /// The image ID container `container` runs (`status.imageID`, usually a digest).
    pub fn running_image_id(&self, container: &str) -> Option<&str> {
        Some(self.container_status(container)?.image_id.as_str()).filter(|i| !i.is_empty())
    }

    /// When container `container` started (RFC 3339), while it runs; `None` otherwise.
    pub fn started_at(&self, container: &str) -> Option<&str> {
        self.container_status(container)?
            .state
            .running
            .as_ref()?
            .started_at
            .as_deref()
    }

    /// What container `container` (or init container) wrote to its termination message
    /// (`/dev/termination-log`) before it ended, as the kubelet reports it (at most 4 KiB): how
    /// a Pod that runs a task (a backup) hands its result to the plugin. `None` while it runs,
    /// or when it wrote none.
    pub fn termination_message(&self, container: &str) -> Option<&str> {
        self.container_statuses
            .iter()
            .chain(&self.init_container_statuses)
            .find(|s| s.name == container)?
            .state
            .terminated
            .as_ref()?
            .message
            .as_deref()
            .filter(|m| !m.is_empty())
    }

    fn container_status(&self, container: &str) -> Option<&ContainerStatusFields> {
        self.container_statuses.iter().find(|s| s.name == container)
    }
}

impl Observation {
    /// The Pod children, sorted by name.
    pub fn pods(&self) -> Result<Vec<ObservedPod>, PolicyError> {
        let mut pods = self
            .children_of_kind(&pod_kind())
            .map(ObservedPod::read)
            .collect::<Result<Vec<_>, _>>()?;
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(pods)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(object: Value) -> ObservedPod {
        let child = Child {
            kind: pod_kind(),
            object: object.to_string(),
        };
        ObservedPod::read(&child).expect("a pod")
    }

    #[test]
    fn a_running_ready_pod() {
        let p = pod(json!({
            "metadata": {"name": "db-0", "labels": {"role": "primary"}, "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "sidecar", "image": "s:1"}, {"name": "db", "image": "db:2"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "db", "restartCount": 3, "state": {"running": {}}}],
            },
        }));
        assert_eq!((p.name.as_str(), p.phase.as_str()), ("db-0", "Running"));
        assert!(p.ready && !p.terminating && !p.is_gone());
        assert_eq!(p.label("role"), Some("primary"));
        assert_eq!(p.annotation("a"), Some("b"));
        assert_eq!(p.image("db"), Some("db:2"));
        assert_eq!(p.image("other"), None);
        assert!(p.args("db").is_empty() && p.args("other").is_empty());
        assert_eq!(p.restarts("db"), 3);
        assert_eq!(p.waiting_reason("db"), None);
        assert_eq!(p.ready_changed_at(), None, "not reported");
        assert_eq!(p.started_at("db"), None, "not reported");
        assert_eq!(p.running_image("db"), None);
    }

    #[test]
    fn a_restarted_container_reports_its_image_and_start_and_readiness_its_change() {
        let p = pod(json!({
            "metadata": {"name": "db-0"},
            "spec": {"containers": [{"name": "db", "image": "db:3"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2024-05-01T12:00:00Z"}],
                "containerStatuses": [{
                    "name": "db", "restartCount": 1,
                    "image": "docker.io/library/db:2", "imageID": "docker.io/library/db@sha256:ab",
                    "state": {"running": {"startedAt": "2024-05-01T11:59:30Z"}},
                }],
            },
        }));
        assert!(!p.ready);
        assert_eq!(p.ready_changed_at(), Some("2024-05-01T12:00:00Z"));
        assert_eq!(p.image("db"), Some("db:3"), "the spec's");
        assert_eq!(p.running_image("db"), Some("docker.io/library/db:2"));
        assert_eq!(
            p.running_image_id("db"),
            Some("docker.io/library/db@sha256:ab")
        );
        assert_eq!(p.started_at("db"), Some("2024-05-01T11:59:30Z"));
        assert_eq!(p.started_at("other"), None);
    }

    #[test]
    fn gone_or_crash_looping_pods() {
        let crash_looping = pod(json!({
            "metadata": {"name": "db-1"},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "db", "restartCount": 6, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ]},
        }));
        assert!(!crash_looping.ready && !crash_looping.is_gone());
        assert_eq!(crash_looping.waiting_reason("db"), Some("CrashLoopBackOff"));
        let terminating = pod(json!({
            "metadata": {"name": "db-2", "deletionTimestamp": "2024-05-01T12:00:00Z"},
        }));
        assert!(terminating.terminating && terminating.is_gone());
        assert_eq!(terminating.restarts("db"), 0);
        let failed = pod(json!({"metadata": {"name": "db-3"}, "status": {"phase": "Failed"}}));
        assert!(failed.is_gone());
    }

    #[test]
    fn a_child_that_is_not_a_pod_is_an_error() {
        let child = |object: &str| Child {
            kind: pod_kind(),
            object: object.to_owned(),
        };
        assert!(ObservedPod::read(&child("[1,2")).is_err());
        assert!(ObservedPod::read(&child(r#"{"metadata": {"name": 5}}"#)).is_err());
    }

    #[test]
    fn the_whole_pod_is_parsed_only_when_asked_for_and_equality_is_the_pod_s() {
        let object = json!({
            "metadata": {"name": "db-0", "uid": "u-1"},
            "spec": {"nodeName": "n-1", "containers": [{"name": "db", "image": "db:2", "args": ["--x"]}]},
        });
        let p = pod(object.clone());
        let untouched = p.clone();
        assert_eq!(p.object(), &object, "the whole pod, as handed over");
        assert_eq!(p.object()["spec"]["containers"][0]["args"][0], "--x");
        assert_eq!(p.args("db"), ["--x"]);
        assert_eq!(p, untouched, "parsed or not, the same pod");
        assert_ne!(p, pod(json!({"metadata": {"name": "db-0", "uid": "u-2"}})));
    }

    #[test]
    fn a_task_pod_hands_its_result_over_in_its_termination_message() {
        let ended = pod(json!({
            "metadata": {"name": "db-backup"},
            "status": {"phase": "Succeeded", "containerStatuses": [
                {"name": "backup", "state": {"terminated": {"exitCode": 0, "message": "file=a.sql rows=3"}}},
                {"name": "quiet", "state": {"terminated": {"exitCode": 0, "message": ""}}},
            ], "initContainerStatuses": [
                {"name": "first", "state": {"terminated": {"exitCode": 0, "message": "done"}}},
                {"name": "again", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ]},
        }));
        assert_eq!(
            ended.termination_message("backup"),
            Some("file=a.sql rows=3")
        );
        assert_eq!(
            ended.termination_message("quiet"),
            None,
            "an empty message is none"
        );
        assert_eq!(ended.termination_message("absent"), None);
        assert_eq!(
            ended.termination_message("first"),
            Some("done"),
            "an init container's"
        );
        let running = pod(json!({
            "metadata": {"name": "db-backup"},
            "status": {"phase": "Running", "containerStatuses": [{"name": "backup", "state": {"running": {}}}]},
        }));
        assert_eq!(running.termination_message("backup"), None);
    }
}
