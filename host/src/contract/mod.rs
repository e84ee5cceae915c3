//! The WIT contract (`wit/policy.wit`) as Rust types: the generated bindings and the shims of
//! frozen versions ([`v0_1`]), the ground floor every stage and capability builds on.
//!
//! It imports nothing of the host. In particular the exchange's `connection` resource stays the
//! opaque handle `bindgen!` generates (no `with:` mapping it to a host type): the exchange
//! capability keeps its open connections in its own table keyed by the handle's `rep()`, as
//! Spin's factors do. Mapping it to a host type would have made the contract import the
//! capability that implements it, and that capability imports the contract.

pub mod v0_1;

/// The bindings generated from `wit/policy.wit`; the WIT file is their documentation.
#[allow(missing_docs)]
mod generated {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "policy-plugin",
        imports: { default: async },
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

pub use generated::*;

pub use generated::exports::policy_host::policy::policy::PolicyError;
pub use generated::policy_host::policy::app_call;
pub use generated::policy_host::policy::credentials;
pub use generated::policy_host::policy::exchange;
pub use generated::policy_host::policy::log::Level as LogLevel;
pub use generated::policy_host::policy::metrics;
pub use generated::policy_host::policy::types::{
    Action, Capability, Child, Decision, Event, EventType, FinalizeDecision, KindRef, ObjectRef,
    Observation, PolicyInfo, Timestamp,
};

/// The contract version this host serves, from the WIT package.
pub const CONTRACT_VERSION: &str = "0.2.3";

/// The version of the contract's `policy` interface a component exports (`0.2.3`, `0.2.2`,
/// `0.1.0`, ...), if it exports one: what the plugin was built against.
pub fn exported_version(
    engine: &wasmtime::Engine,
    component: &wasmtime::component::Component,
) -> Option<String> {
    component
        .component_type()
        .exports(engine)
        .find_map(|(name, _)| {
            name.strip_prefix("policy-host:policy/policy@")
                .map(str::to_owned)
        })
}

/// Older contract versions this host also serves, each through bindings of its frozen WIT
/// (see [`v0_1`]).
pub const PREVIOUS_CONTRACT_VERSIONS: &[&str] = &["0.1.0"];

impl KindRef {
    /// `group/version` as Kubernetes writes it in `apiVersion` (`v1` for the core group).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// True when `api_version`/`kind` (as found in an object) name this kind.
    pub fn matches(&self, api_version: &str, kind: &str) -> bool {
        self.kind == kind && self.api_version() == api_version
    }
}

impl std::fmt::Display for KindRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.plural, self.api_version())
    }
}

impl Action {
    /// Bytes of plugin-produced text in this action, for the output cap.
    pub fn output_len(&self) -> usize {
        match self {
            Action::Apply(json) | Action::SetStatus(json) => json.len(),
            Action::Delete(target) => target.name.len(),
            Action::RecordEvent(event) => event.reason.len() + event.message.len(),
        }
    }
}
