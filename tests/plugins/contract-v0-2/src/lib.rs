//! A plugin built against contract `policy-host:policy@0.2.0`, from the frozen WIT
//! (`wit/frozen/0.2.0/`), as a plugin released before 0.2.1 would be: hosts serving a later
//! 0.2.x must load it, describe it, and run its decisions (log and app-call imports included)
//! unchanged, through the current bindings (semver-compatible names).
//!
//! On each reconcile it logs, makes one app-call to pod `app-0` port `http` path `/v1`, and
//! applies a ConfigMap `<parent>-v020` whose data carries the app-call's outcome.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code, missing_docs)]
mod bindings {
    // Generated FFI from the frozen 0.2.0 world; sound because both sides come from one file.
    wit_bindgen::generate!({ path: "../../../wit/frozen/0.2.0", world: "policy-plugin" });
}

// `export!` expands to the exported FFI functions (unsafe by nature), sound for the same reason.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod plugin {
    use super::bindings::exports::policy_host::policy::policy::Guest;
    use super::bindings::policy_host::policy::types::{
        Action, Capability, Decision, FinalizeDecision, KindRef, Observation, PolicyError,
        PolicyInfo,
    };
    use super::bindings::policy_host::policy::{app_call, log};

    struct Legacy;

    fn kind(group: &str, version: &str, kind: &str, plural: &str) -> KindRef {
        KindRef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
        }
    }

    impl Guest for Legacy {
        fn describe() -> PolicyInfo {
            PolicyInfo {
                name: "legacy-v020".into(),
                version: "0.1.0".into(),
                target: kind("test.policy-host.io", "v1", "Probe", "probes"),
                children: vec![kind("", "v1", "ConfigMap", "configmaps")],
                capabilities: vec![Capability::AppCall("http".into())],
                wants_finalizer: false,
            }
        }

        fn reconcile(observation: Observation) -> Result<Decision, PolicyError> {
            let parent: serde_json_lite::Name = serde_json_lite::name(&observation.parent);
            log::log(
                log::Level::Info,
                "0.2.0 plugin deciding",
                &[("parent".into(), parent.0.clone())],
            );
            let answer = app_call::call(&app_call::Request {
                pod: "app-0".into(),
                port: "http".into(),
                method: app_call::Method::Get,
                path: "/v1".into(),
                body: None,
            });
            let outcome = match answer {
                Ok(response) => format!("{} {}", response.status, response.body),
                Err(app_call::CallError::Refused(why)) => format!("refused: {why}"),
                Err(app_call::CallError::Unreachable(why)) => format!("unreachable: {why}"),
                Err(app_call::CallError::Timeout) => "timeout".into(),
            };
            let config_map = format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{}-v020"}},"data":{{"appCall":{}}}}}"#,
                parent.0,
                quote(&outcome)
            );
            Ok(Decision {
                actions: vec![Action::Apply(config_map)],
                requeue_after_ms: None,
            })
        }

        fn finalize(_: Observation) -> Result<FinalizeDecision, PolicyError> {
            Ok(FinalizeDecision {
                actions: vec![],
                done: true,
                requeue_after_ms: None,
            })
        }
    }

    /// A JSON string literal (the fixture has no JSON dependency, like a minimal old plugin).
    fn quote(text: &str) -> String {
        let mut out = String::from("\"");
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    mod serde_json_lite {
        /// The parent's `metadata.name`.
        pub struct Name(pub String);

        /// Finds `"name":"..."` after `"metadata"` (enough for the fixture's parents).
        pub fn name(parent: &str) -> Name {
            let after = parent.find("\"metadata\"").map_or(parent, |i| &parent[i..]);
            let value = after
                .find("\"name\":\"")
                .map(|i| &after[i + 8..])
                .and_then(|rest| rest.find('"').map(|end| rest[..end].to_owned()))
                .unwrap_or_default();
            Name(value)
        }
    }

    super::bindings::export!(Legacy with_types_in super::bindings);
}
