//! Write policy-host plugins in Rust.
//!
//! A plugin is a WebAssembly component that holds the domain knowledge of one custom
//! resource kind; the host does all the Kubernetes work (see `wit/policy.wit`, the
//! contract). With this SDK a plugin author writes one [`Plugin`] impl over plain Rust
//! types, and one line to export it:
//!
//! ```
//! use policy_host_sdk::prelude::*;
//!
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     fn describe() -> PolicyInfo {
//!         PolicyInfo {
//!             name: "hello".into(),
//!             version: env!("CARGO_PKG_VERSION").into(),
//!             target: KindRef::namespaced("example.com", "v1", "Hello", "hellos"),
//!             children: vec![children::config_map_kind()],
//!             capabilities: vec![],
//!             wants_finalizer: false,
//!         }
//!     }
//!
//!     fn reconcile(observation: &Observation, _app: &mut dyn AppCall) -> Result<Decision, PolicyError> {
//!         let name = observation.parent_name()?;
//!         let child = children::child_object(
//!             &children::config_map_kind(),
//!             &format!("{name}-hello"),
//!             &[],
//!             serde_json::json!({ "data": { "greeting": "hello" } }),
//!         );
//!         Ok(Decision::nothing().with(Action::Apply(child)))
//!     }
//! }
//!
//! policy_host_sdk::export_plugin!(Hello);
//! ```
//!
//! Modules, from the contract outwards:
//!
//! - [`contract`] — plain-Rust mirrors of the WIT types, with small constructors.
//! - [`observation`] — the parent and children as your own types.
//! - [`pods`] — observed Pods: phase, readiness, deletion, containers' images and restarts.
//! - [`children`] — kind references of built-in kinds, child object skeletons, and builders
//!   of the Pod, Service, PersistentVolumeClaim and PodDisruptionBudget of a stateful app.
//! - [`desired`] — the children wanted now, as applies plus deletes of the owned rest.
//! - [`conditions`] — status conditions that keep `lastTransitionTime`.
//! - [`schedule`] — durations and RFC 3339 times: when a scheduled run (a backup) is due.
//! - [`names`] — whether the child names derived from the parent's name are valid.
//! - [`app_call`] — the client for the one way out of the sandbox.
//! - [`session`] — one TCP connection held for a conversation (server-first greetings,
//!   authentication, several queries), cut into the protocol's frames.
//! - [`exchange`] — one request and one reply over a fresh session.
//! - [`log`] — lines in the host's log.
//! - [`metrics`] — gauges and counters about the parent, declared once and reported in
//!   decisions, which the host exports on its `/metrics`.
//! - [`testing`] — the native harness: observations in, decisions out, a scripted app.
//! - `wasm` (only on `wasm32`) — the generated bindings and the export adapter.
//!
//! The SDK does not depend on the host, and nothing but `wasm` depends on wasm: decision
//! logic tests natively with `cargo test`. The authoring guide is `wit/sdk/README.md`.

pub mod app_call;
pub mod children;
pub mod conditions;
pub mod contract;
pub mod credentials;
pub mod desired;
pub mod exchange;
pub mod log;
pub mod metrics;
pub mod names;
pub mod observation;
pub mod pods;
pub mod schedule;
pub mod session;
pub mod testing;

#[cfg(target_arch = "wasm32")]
pub mod wasm;

pub use app_call::AppCall;
pub use contract::{
    Action, AppCallError, AppCallRequest, AppCallResponse, Capability, Child, Decision, Event,
    EventType, FinalizeDecision, KindRef, Method, Observation, PolicyError, PolicyInfo, Timestamp,
    TlsClient,
};
pub use credentials::{Credential, CredentialError};
pub use exchange::{ExchangeError, ExchangeRequest};
pub use session::Session;

/// The names a plugin usually needs: `use policy_host_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::Plugin;
    pub use crate::app_call::AppCall;
    pub use crate::children;
    pub use crate::conditions::{Condition, set_condition};
    pub use crate::contract::{
        Action, AppCallError, AppCallRequest, AppCallResponse, Capability, Child, Decision, Event,
        FinalizeDecision, KindRef, Method, Observation, PolicyError, PolicyInfo, Timestamp,
        TlsClient,
    };
    pub use crate::credentials::{Credential, CredentialError};
    pub use crate::desired::Desired;
    pub use crate::metrics::{Counter, Gauge, Metric};
    pub use crate::session::{Session, frames};
}

/// A policy plugin: what it reconciles, and its decisions. Implement it on a unit struct
/// and export it with [`export_plugin!`].
///
/// The host's rules, which the methods must follow (see `wit/sdk/README.md`):
/// decisions must be **idempotent** — the host calls `reconcile` again with the same
/// observation, on every change and after every restart, with no memory of earlier calls —
/// and must come from the observation alone (no clock, filesystem, network or environment;
/// the only way out is `app`, to granted ports of pods the parent owns).
pub trait Plugin {
    /// Describes the plugin: its name and version, the parent kind, the child kinds it
    /// creates (the host refuses any other), the capabilities it asks for. Called once per
    /// load; must not use app-calls.
    fn describe() -> PolicyInfo;

    /// The domain metrics the plugin's decisions may report ([`crate::metrics`]), declared to
    /// the host while `describe` runs. The default is none.
    fn metrics() -> Vec<metrics::Metric> {
        Vec::new()
    }

    /// Decides what to do for one observation.
    fn reconcile(observation: &Observation, app: &mut dyn AppCall)
    -> Result<Decision, PolicyError>;

    /// Decides cleanup while the parent is being deleted; only called when
    /// `describe().wants_finalizer`. The default is "nothing to clean up".
    fn finalize(
        observation: &Observation,
        app: &mut dyn AppCall,
    ) -> Result<FinalizeDecision, PolicyError> {
        let _ = (observation, app);
        Ok(FinalizeDecision::done())
    }
}

/// Exports a [`Plugin`] impl as the component's `policy` interface:
/// `policy_host_sdk::export_plugin!(MyPlugin);` at the crate root, once.
///
/// On `wasm32` it expands to the generated export functions (which are `unsafe` FFI, hence
/// the `allow(unsafe_code)` on the expansion: see `wasm::bindings` for why it is sound). On
/// other targets it only checks that the type implements [`Plugin`], so the crate builds and
/// tests natively unchanged.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        const _: fn() = || {
            fn is_a_plugin<P: $crate::Plugin>() {}
            is_a_plugin::<$plugin>();
        };
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code)]
        const _: () = {
            type PolicyHostSdkExported = $crate::wasm::Exported<$plugin>;
            $crate::__export_policy_plugin_impl!(
                PolicyHostSdkExported with_types_in $crate::wasm::bindings
            );
        };
    };
}
