//! Decide: runs a policy plugin in its wasmtime sandbox and turns an observation into a
//! decision, within hard limits.
//!
//! One [`Sandbox`] per process owns the wasmtime engine. A plugin is compiled once into a
//! [`Plugin`] (component + pre-instantiated imports); every reconcile gets a fresh instance in
//! a fresh store, so no state survives between decisions and a poisoned instance (after a
//! trap or an interrupt) is simply dropped.
//!
//! Why these mechanisms:
//! - **Epoch interruption, not fuel**, for the deadline: it costs a load and compare at loop
//!   back-edges instead of fuel's counter updates everywhere, and its unit is wall-clock time,
//!   which is what an operator cares about. A background thread ticks the epoch every
//!   [`EPOCH_TICK`]. Time spent awaiting an app-call is not wasm execution, so the whole call is
//!   also wrapped in a tokio timeout of the same deadline.
//! - **Pooling allocator with pre-instantiation**: instantiation becomes a few µs of slot reuse
//!   instead of mmap/munmap per reconcile; its slot count bounds concurrent reconciles. Each
//!   slot reserves 4 GiB of *virtual* space so guest memory accesses need no bounds checks.
//! - **A resource limiter** for the memory cap, per plugin, that refuses growth with a trap
//!   (rather than letting the guest see a failed grow and abort on its own), so the error can
//!   say which limit was hit.
//!
//! The parts: [`sandbox`] builds the engine and links the imports, [`plugin`] is a compiled
//! plugin's lifecycle (describe, reconcile, finalize under every limit), [`instance`] is the
//! state of one instance (WASI, memory limiter, log, and the capabilities' [`Doors`]).
//!
//! [`Doors`]: crate::capability::Doors

pub mod instance;
pub mod plugin;
pub mod sandbox;

use std::time::Duration;

use crate::contract;
pub use plugin::{Plugin, ReusedInstance};
pub use sandbox::Sandbox;

/// How often the epoch advances; the resolution of the deadline.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Largest linear memory any plugin may have; per-plugin caps are at most this.
pub const MAX_PLUGIN_MEMORY: usize = 512 << 20;

/// Hard limits for one plugin's reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time one reconcile (or finalize) may take, app-calls included.
    pub deadline: Duration,
    /// Linear memory the plugin may grow to.
    pub memory_bytes: usize,
    /// Total size of the text a decision may carry (objects, status, events) and of each
    /// log line or app-call body crossing the boundary.
    pub output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(10),
            memory_bytes: 64 << 20,
            output_bytes: 4 << 20,
        }
    }
}

/// Why a plugin produced no decision.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The bytes are not a component this host can run.
    #[error(
        "plugin {source_name} is not a loadable component of world `policy-plugin@{version}`: {message}; build it for wasm32-wasip2 against wit/policy.wit",
        version = contract::CONTRACT_VERSION
    )]
    Load {
        /// Where the bytes came from.
        source_name: String,
        /// What wasmtime said.
        message: String,
    },
    /// The plugin ran past its deadline.
    #[error(
        "plugin `{plugin}` ran past its {deadline:?} deadline while {doing}; raise its deadline limit or fix the plugin"
    )]
    Deadline {
        /// Plugin name@version.
        plugin: String,
        /// The limit.
        deadline: Duration,
        /// What it was doing.
        doing: String,
    },
    /// The plugin tried to grow its memory past the cap.
    #[error(
        "plugin `{plugin}` exceeded its {limit_mib} MiB memory limit while {doing}; raise its memory limit or fix the plugin"
    )]
    Memory {
        /// Plugin name@version.
        plugin: String,
        /// The limit in MiB.
        limit_mib: usize,
        /// What it was doing.
        doing: String,
    },
    /// The decision was larger than the output cap.
    #[error(
        "plugin `{plugin}` returned {size} bytes while {doing}, over its {limit} byte output limit; raise its output limit or make the decision smaller"
    )]
    Output {
        /// Plugin name@version.
        plugin: String,
        /// Size of the output.
        size: usize,
        /// The limit.
        limit: usize,
        /// What it was doing.
        doing: String,
    },
    /// The decision carries a credential handed to the plugin (status, an applied object or
    /// an Event): refused whole, naming the key, never the value.
    #[error(
        "plugin `{plugin}` put the credential of Secret `{secret}` key `{key}` into its decision ({place}) while {doing}; nothing of the decision was carried out: a credential may reach pods only through a secretKeyRef, this is a bug in the plugin"
    )]
    CredentialLeak {
        /// Plugin name@version.
        plugin: String,
        /// What it was doing.
        doing: String,
        /// The Secret.
        secret: String,
        /// Its key.
        key: String,
        /// Which action.
        place: String,
    },
    /// The plugin trapped (panic, unreachable, bad memory access, ...).
    #[error("plugin `{plugin}` crashed while {doing}: {message}; this is a bug in the plugin")]
    Trap {
        /// Plugin name@version.
        plugin: String,
        /// What it was doing.
        doing: String,
        /// The trap and its wasm backtrace.
        message: String,
    },
    /// Every instance slot of the host was taken for longer than the host waits: retried.
    #[error(
        "no sandbox slot was free for plugin `{plugin}` while {doing}: the host runs as many plugin instances as it can hold; it is retried shortly (lower the plugins' concurrency if this persists)"
    )]
    SandboxBusy {
        /// Plugin name@version.
        plugin: String,
        /// What it was doing.
        doing: String,
    },
    /// The plugin refused to decide and said why.
    #[error("plugin `{plugin}` refused to decide while {doing}: {reason}: {message}")]
    Refused {
        /// Plugin name@version.
        plugin: String,
        /// What it was doing.
        doing: String,
        /// The plugin's reason.
        reason: String,
        /// The plugin's message.
        message: String,
    },
}

impl DecideError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &str {
        match self {
            DecideError::Load { .. } => "PluginLoadFailed",
            DecideError::Deadline { .. } => "PluginDeadlineExceeded",
            DecideError::Memory { .. } => "PluginMemoryExceeded",
            DecideError::Output { .. } => "PluginOutputTooLarge",
            DecideError::CredentialLeak { .. } => "PluginLeaksCredential",
            DecideError::Trap { .. } => "PluginCrashed",
            DecideError::SandboxBusy { .. } => "SandboxBusy",
            DecideError::Refused { reason, .. } => reason,
        }
    }
}
