//! What the one-shot containers of a Pod (a backup's save, restore and upload steps) report:
//! a step's `terminated` state, a one-line summary of it, and the Pod's age and readiness.
//!
//! Shared by the EtcdCluster's own backups and the `EtcdBackup` plugin, which read the same
//! kind of Pod.

use policy_host_sdk::pods::ObservedPod;
use serde_json::Value;

use crate::protocol::Timestamp;
use crate::schedule::parse_rfc3339;

/// A container's `state.terminated`, from `list` (`initContainerStatuses` or
/// `containerStatuses`).
pub fn terminated<'p>(pod: &'p ObservedPod, list: &str, container: &str) -> Option<&'p Value> {
    pod.object()["status"][list]
        .as_array()?
        .iter()
        .find(|s| s["name"] == container)?
        .get("state")?
        .get("terminated")
}

/// `exit code N` and, when kubelet kept one (`terminationMessagePolicy:
/// FallbackToLogsOnError`), the end of the container's output.
pub fn exit_summary(state: &Value) -> String {
    let code = state["exitCode"].as_i64().unwrap_or(-1);
    let message = state["message"].as_str().map(str::trim).unwrap_or_default();
    if message.is_empty() {
        format!("exit code {code}")
    } else {
        let tail: String = message
            .chars()
            .rev()
            .take(300)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("exit code {code}: {tail}")
    }
}

/// When the Pod became Ready (its `Ready` condition's transition), else when it was created.
pub fn ready_since(pod: &ObservedPod) -> Option<i64> {
    pod.object()["status"]["conditions"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .and_then(|c| c["lastTransitionTime"].as_str())
        .or_else(|| pod.object()["metadata"]["creationTimestamp"].as_str())
        .and_then(parse_rfc3339)
}

/// Seconds since the Pod was created, at `now`.
pub fn age(pod: &ObservedPod, now: Timestamp) -> Option<i64> {
    pod.object()["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(parse_rfc3339)
        .map(|created| now.seconds - created)
}
