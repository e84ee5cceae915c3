//! Pod security of what a plugin creates: the levels an admin's grant allows, and the check of
//! a Pod, or of the pod template inside a workload, against them (review #11: through the
//! host's ServiceAccount a plugin could otherwise create privileged pods in any namespace).
//!
//! `baseline` (the default) is the Pod Security Standards' baseline
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/#baseline>), every
//! control of it, because a plugin copies parts of its parent's spec into pods (an EtcdCluster's
//! `spec.pod.securityContext` and annotations) and the namespace need not run Pod Security
//! Admission: no host network, PID or IPC namespace, no Windows host process, no privileged
//! container, no capability beyond the baseline set, no `hostPath` volume, no host port, no
//! AppArmor, seccomp or SELinux setting beyond the baseline's (pod and container
//! `securityContext`, and the AppArmor and seccomp annotations), no unmasked `/proc`, and only
//! the namespaced, isolated sysctls. `privileged` checks nothing and must be granted by the
//! admin.

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

/// SELinux types a baseline pod or container may ask for (besides none).
const BASELINE_SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Sysctls a baseline pod may set: namespaced in the pod and isolated from other pods (the
/// standard's list as of Kubernetes 1.29).
const BASELINE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// The AppArmor annotation of one container (deprecated by `appArmorProfile`, still honoured
/// by the kubelet).
const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";
/// The seccomp annotations (removed from the kubelet in 1.27; refused where they unconfine, as
/// an older node still reads them).
const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_ANNOTATION: &str = "container.seccomp.security.alpha.kubernetes.io/";

/// The pod template inside `object` as (metadata, spec): a Pod's own, a workload's template,
/// a CronJob's job template.
pub(crate) fn pod_template(object: &Value) -> Option<(&Value, &Value)> {
    let template = match object["kind"].as_str()? {
        "Pod" => return Some((&object["metadata"], &object["spec"])),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => &object["spec"]["template"],
        "CronJob" => &object["spec"]["jobTemplate"]["spec"]["template"],
        "PodTemplate" => &object["template"],
        _ => return None,
    };
    Some((&template["metadata"], &template["spec"]))
}

/// What breaks baseline in a pod's or a container's `securityContext` among the fields both
/// have; `whose` names it ("the pod", "container etcd").
fn context_breaks(context: &Value, whose: &str) -> Option<String> {
    if context["windowsOptions"]["hostProcess"] == true {
        return Some(format!("{whose} runs as a Windows hostProcess"));
    }
    let selinux = &context["seLinuxOptions"];
    if let Some(kind) = selinux["type"].as_str()
        && !kind.is_empty()
        && !BASELINE_SELINUX_TYPES.contains(&kind)
    {
        return Some(format!(
            "{whose} asks for the SELinux type {kind} (baseline allows {BASELINE_SELINUX_TYPES:?})"
        ));
    }
    for field in ["user", "role"] {
        if selinux[field].as_str().is_some_and(|v| !v.is_empty()) {
            return Some(format!("{whose} sets seLinuxOptions.{field}"));
        }
    }
    for field in ["seccompProfile", "appArmorProfile"] {
        if let Some(kind) = context[field]["type"].as_str()
            && kind != "RuntimeDefault"
            && kind != "Localhost"
        {
            return Some(format!(
                "{whose} sets {field}.type {kind} (baseline allows RuntimeDefault or Localhost)"
            ));
        }
    }
    None
}

/// What breaks baseline in a pod template's annotations: AppArmor other than the runtime's
/// default or a local profile, seccomp unconfined.
fn annotations_break(metadata: &Value) -> Option<String> {
    let annotations = metadata["annotations"].as_object()?;
    annotations.iter().find_map(|(key, value)| {
        let value = value.as_str().unwrap_or_default();
        let apparmor = key.starts_with(APPARMOR_ANNOTATION)
            && value != "runtime/default"
            && !value.starts_with("localhost/");
        let seccomp = (key == SECCOMP_POD_ANNOTATION
            || key.starts_with(SECCOMP_CONTAINER_ANNOTATION))
            && value == "unconfined";
        (apparmor || seccomp).then(|| format!("the annotation {key}: {value}"))
    })
}

/// Checks `object` (any applied child) against `level`: `Err` says what breaks it.
pub fn check(object: &Value, level: PodSecurity) -> Result<(), String> {
    if level == PodSecurity::Privileged {
        return Ok(());
    }
    let Some((metadata, spec)) = pod_template(object) else {
        return Ok(());
    };
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == true {
            return Err(format!("{field}: true"));
        }
    }
    if let Some(why) = annotations_break(metadata) {
        return Err(why);
    }
    let pod_context = &spec["securityContext"];
    if let Some(why) = context_breaks(pod_context, "the pod") {
        return Err(why);
    }
    if let Some(sysctl) = pod_context["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .find(|name| !BASELINE_SYSCTLS.contains(name))
    {
        return Err(format!(
            "the sysctl {sysctl}, which is not namespaced and isolated (baseline allows {BASELINE_SYSCTLS:?})"
        ));
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
        if let Some(mount) = context["procMount"].as_str()
            && mount != "Default"
        {
            return Err(format!(
                "container {name} sets procMount {mount} (baseline allows Default)"
            ));
        }
        if let Some(why) = context_breaks(context, &format!("container {name}")) {
            return Err(why);
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
            (
                "a pod SELinux type outside the baseline set",
                pod(
                    json!({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}, "containers": []}),
                ),
                "spc_t",
            ),
            (
                "a container SELinux type outside the baseline set",
                pod(container(
                    json!({"securityContext": {"seLinuxOptions": {"type": "unconfined_t"}}}),
                )),
                "unconfined_t",
            ),
            (
                "an SELinux user",
                pod(
                    json!({"securityContext": {"seLinuxOptions": {"user": "system_u"}}, "containers": []}),
                ),
                "seLinuxOptions.user",
            ),
            (
                "an SELinux role",
                pod(container(
                    json!({"securityContext": {"seLinuxOptions": {"role": "sysadm_r"}}}),
                )),
                "seLinuxOptions.role",
            ),
            (
                "an unconfined pod seccomp profile",
                pod(
                    json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}, "containers": []}),
                ),
                "seccompProfile",
            ),
            (
                "an unconfined container seccomp profile",
                pod(container(
                    json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
                )),
                "seccompProfile",
            ),
            (
                "an unconfined pod AppArmor profile",
                pod(
                    json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}, "containers": []}),
                ),
                "appArmorProfile",
            ),
            (
                "an unconfined container AppArmor profile",
                pod(container(
                    json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}),
                )),
                "appArmorProfile",
            ),
            (
                "an unconfined AppArmor annotation",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {
                    "container.apparmor.security.beta.kubernetes.io/etcd": "unconfined"}},
                    "spec": {"containers": [{"name": "etcd"}]}}),
                "container.apparmor.security.beta.kubernetes.io/etcd",
            ),
            (
                "an unconfined AppArmor annotation on a StatefulSet's template",
                json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s"},
                    "spec": {"template": {"metadata": {"annotations": {
                        "container.apparmor.security.beta.kubernetes.io/app": "unconfined"}},
                        "spec": {"containers": [{"name": "app"}]}}}}),
                "unconfined",
            ),
            (
                "an unconfined seccomp annotation",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {
                    "seccomp.security.alpha.kubernetes.io/pod": "unconfined"}},
                    "spec": {"containers": []}}),
                "seccomp.security.alpha.kubernetes.io/pod",
            ),
            (
                "an unsafe sysctl",
                pod(json!({"securityContext": {"sysctls": [
                    {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                    {"name": "kernel.core_pattern", "value": "|/evil"}]}, "containers": []})),
                "kernel.core_pattern",
            ),
            (
                "an unmasked /proc",
                pod(container(
                    json!({"securityContext": {"procMount": "Unmasked"}}),
                )),
                "procMount",
            ),
            (
                "a Windows host process",
                pod(
                    json!({"securityContext": {"windowsOptions": {"hostProcess": true}}, "containers": []}),
                ),
                "hostProcess",
            ),
            (
                "an ephemeral container's host port",
                pod(
                    json!({"containers": [], "ephemeralContainers": [{"name": "debug",
                    "ports": [{"containerPort": 22, "hostPort": 2222}]}]}),
                ),
                "host port",
            ),
        ];
        // Every row is checked before failing, so a report names each way out left open.
        let mut open = Vec::new();
        for (situation, object, fragment) in rows {
            let refused = check(&object, PodSecurity::Baseline);
            if !refused.as_ref().is_err_and(|m| m.contains(fragment)) {
                open.push(format!("{situation}: {refused:?}"));
            }
            assert_eq!(
                check(&object, PodSecurity::Privileged),
                Ok(()),
                "{situation}"
            );
        }
        assert!(
            open.is_empty(),
            "baseline lets through:\n{}",
            open.join("\n")
        );
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
            // What baseline leaves to the pod: the runtime's defaults named explicitly, a
            // baseline SELinux type and level, local profiles, safe sysctls.
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {
                    "container.apparmor.security.beta.kubernetes.io/etcd": "runtime/default",
                    "container.apparmor.security.beta.kubernetes.io/sidecar": "localhost/tight",
                    "seccomp.security.alpha.kubernetes.io/pod": "runtime/default"}},
                "spec": {
                    "securityContext": {
                        "seLinuxOptions": {"type": "container_t", "level": "s0:c123,c456"},
                        "seccompProfile": {"type": "RuntimeDefault"},
                        "appArmorProfile": {"type": "Localhost", "localhostProfile": "tight"},
                        "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"},
                            {"name": "kernel.shm_rmid_forced", "value": "1"}],
                        "windowsOptions": {"hostProcess": false}},
                    "containers": [{"name": "etcd", "securityContext": {
                        "procMount": "Default",
                        "seLinuxOptions": {"type": "container_init_t"},
                        "seccompProfile": {"type": "Localhost", "localhostProfile": "etcd.json"},
                        "appArmorProfile": {"type": "RuntimeDefault"}}}]}}),
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
