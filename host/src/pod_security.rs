//! Pod security of what a plugin creates: the levels an admin's grant allows, and the check of
//! a Pod, or of the pod template inside a workload, against them (review #11: through the
//! host's ServiceAccount a plugin could otherwise create privileged pods in any namespace).
//!
//! `baseline` (the default) follows the Pod Security Standards' baseline for the fields that
//! break out of a pod: no host network, PID or IPC namespace, no `hostPath` volume, no
//! privileged container, no host port, and no capability beyond the baseline set. `privileged`
//! checks nothing and must be granted by the admin.

use serde_json::Value;

pub use crate::capability::scope::PodSecurity;

/// Capabilities a baseline container may add (the Pod Security Standards' list).
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The pod spec inside `object`: a Pod's own, a workload's template, a CronJob's job template.
fn pod_spec(object: &Value) -> Option<&Value> {
    match object["kind"].as_str()? {
        "Pod" => Some(&object["spec"]),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => Some(&object["spec"]["template"]["spec"]),
        "CronJob" => Some(&object["spec"]["jobTemplate"]["spec"]["template"]["spec"]),
        "PodTemplate" => Some(&object["template"]["spec"]),
        _ => None,
    }
}

/// Checks `object` (any applied child) against `level`: `Err` says what breaks it.
pub fn check(object: &Value, level: PodSecurity) -> Result<(), String> {
    if level == PodSecurity::Privileged {
        return Ok(());
    }
    let Some(spec) = pod_spec(object) else {
        return Ok(());
    };
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == true {
            return Err(format!("{field}: true"));
        }
    }
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        if volume.get("hostPath").is_some() {
            return Err(format!(
                "a hostPath volume ({})",
                volume["name"].as_str().unwrap_or("unnamed")
            ));
        }
    }
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| spec[*list].as_array().into_iter().flatten());
    for container in containers {
        let name = container["name"].as_str().unwrap_or("unnamed");
        let context = &container["securityContext"];
        if context["privileged"] == true {
            return Err(format!("container {name} is privileged"));
        }
        if let Some(added) = context["capabilities"]["add"].as_array()
            && let Some(capability) = added
                .iter()
                .filter_map(Value::as_str)
                .find(|c| !BASELINE_CAPABILITIES.contains(&c.trim_start_matches("CAP_")))
        {
            return Err(format!("container {name} adds the capability {capability}"));
        }
        if let Some(port) = container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["hostPort"].as_i64().is_some_and(|p| p != 0))
        {
            return Err(format!(
                "container {name} binds host port {}",
                port["hostPort"]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
    }

    fn container(extra: Value) -> Value {
        let mut c = json!({"name": "app", "image": "app:1"});
        if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(extra.clone());
        }
        json!({"containers": [c]})
    }

    #[test]
    fn baseline_refuses_each_way_out_of_a_pod_and_privileged_allows_it() {
        let rows = [
            (
                "host network",
                pod(json!({"hostNetwork": true, "containers": []})),
                "hostNetwork",
            ),
            (
                "host PID",
                pod(json!({"hostPID": true, "containers": []})),
                "hostPID",
            ),
            (
                "host IPC",
                pod(json!({"hostIPC": true, "containers": []})),
                "hostIPC",
            ),
            (
                "hostPath",
                pod(
                    json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}], "containers": []}),
                ),
                "hostPath",
            ),
            (
                "privileged",
                pod(container(json!({"securityContext": {"privileged": true}}))),
                "privileged",
            ),
            (
                "an added capability",
                pod(container(
                    json!({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
                )),
                "SYS_ADMIN",
            ),
            (
                "a host port",
                pod(container(
                    json!({"ports": [{"containerPort": 80, "hostPort": 80}]}),
                )),
                "host port",
            ),
            (
                "a privileged init container",
                pod(
                    json!({"initContainers": [{"name": "init", "securityContext": {"privileged": true}}],
                    "containers": []}),
                ),
                "init",
            ),
            (
                "a Deployment's privileged template",
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                    "spec": {"template": {"spec": {"hostNetwork": true, "containers": []}}}}),
                "hostNetwork",
            ),
            (
                "a CronJob's hostPath",
                json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
                    "spec": {"jobTemplate": {"spec": {"template": {"spec": {
                        "volumes": [{"name": "h", "hostPath": {"path": "/var"}}], "containers": []}}}}}}),
                "hostPath",
            ),
        ];
        for (situation, object, fragment) in rows {
            let refused = check(&object, PodSecurity::Baseline);
            assert!(
                refused.as_ref().is_err_and(|m| m.contains(fragment)),
                "{situation}: {refused:?}"
            );
            assert_eq!(
                check(&object, PodSecurity::Privileged),
                Ok(()),
                "{situation}"
            );
        }
    }

    #[test]
    fn baseline_allows_ordinary_pods_and_other_kinds() {
        let rows = [
            pod(container(
                json!({"ports": [{"containerPort": 2379, "name": "client"}],
                "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}}),
            )),
            pod(
                json!({"securityContext": {"runAsNonRoot": true}, "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [{"name": "etcd"}]}),
            ),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                "spec": {"ports": [{"port": 80}]}}),
        ];
        for object in rows {
            assert_eq!(check(&object, PodSecurity::Baseline), Ok(()), "{object}");
        }
    }

    #[test]
    fn levels_read_as_written() {
        assert_eq!(PodSecurity::parse("baseline"), Ok(PodSecurity::Baseline));
        assert_eq!(
            PodSecurity::parse("privileged"),
            Ok(PodSecurity::Privileged)
        );
        assert!(PodSecurity::parse("restricted").is_err());
    }
}
