//! policy-host: a Kubernetes operator that hands every domain decision to a sandboxed
//! WebAssembly plugin. Start with [`run`] (one [`replica`] of the host, from start to exit);
//! one policy's data path is [`controller::reconcile`].
//!
//! The host does the Kubernetes work and nothing domain-specific. The modules, in the order
//! data flows through them:
//!
//! - [`contract`] — the WIT contract as Rust types; the ground floor, importing nothing of the
//!   host;
//! - [`load`] turns files and labelled ConfigMaps into checked, compiled plugins,
//!   [`policy_store`] holds what is loaded and swaps it atomically, and [`supervisor`] keeps one
//!   [`controller`] running per loaded policy; each reconcile is three stages, in one direction:
//! - [`observe`] — the parent custom resource, the children it controls and the time;
//! - [`decide`] — the plugin, in its wasmtime sandbox, turns that into a decision; its only
//!   ways out are the [`capability`] doors (HTTP app-calls, TLS, exchanges), checked against
//!   what the parent controls and the admin granted;
//! - [`act`] — the decision becomes server-side applies, deletes, status and Events;
//! - [`shadow`] — a candidate plugin decides beside the active one, compared, never acted on;
//! - [`rollout`] — a candidate version decides, and is acted on, for the parents a rollout
//!   selects, and is rolled back when it fails more than the active one.
//!
//! Of several replicas, only the one that holds the [`leader`] Lease runs controllers, and it
//! hands the Lease over only once what it started can no longer write; several host
//! deployments can split the parents among them as [`shard`]s, each with its own Lease;
//! [`orphans`] releases the finalizers of plugins that are gone. Around them: [`admin`]
//! (health, readiness, metrics), [`metrics`], [`telemetry`], [`plugin_cli`] (`pack`,
//! `validate`, `simulate` for plugin authors) and [`kubectl`] (`kubectl policy-host` for
//! admins).

// The entry point: one replica's life (load, stand by, lead, hand over).
pub mod replica;

pub mod contract;
// Beside the contract: how an API error reads, for every stage that writes.
pub mod api_error;

pub mod leader;
pub mod load;
pub mod orphans;
pub mod policy_store;
pub mod shard;
pub mod supervisor;

// One reconcile, in data-path order (one line each: rustfmt sorts a group alphabetically).
pub mod controller;

pub mod observe;

pub mod decide;

pub mod capability;

pub mod act;
// What the act stage checks pods against: the pod-security level of the plugin's grant.
pub mod pod_security;
// ...and the images they run and the Secrets they use: the grant's allow-list, opted-in Secrets.
pub mod pod_inputs;

pub mod shadow;
// Beside shadow: a candidate that acts for the parents its rollout selects.
pub mod rollout;
// Beside act: the host's own writes for a parent's opt-in chaos drill.
pub mod chaos;

pub mod admin;
pub mod kubectl;
pub mod metrics;
pub mod plugin_cli;
pub mod telemetry;

pub use replica::{Running, Settings, run};

use std::net::SocketAddr;

use crate::leader::LostLease;
use crate::load::LoadError;

/// Why the host could not run.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A plugin could not be loaded at start.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The sandbox could not be built.
    #[error(transparent)]
    Sandbox(#[from] decide::DecideError),
    /// The app-call HTTP client could not be built.
    #[error(transparent)]
    HttpClient(#[from] capability::http::HttpClientError),
    /// The admin endpoint could not bind.
    #[error("cannot serve the admin endpoint on {addr}: {source}; pick another --admin-addr")]
    Admin {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// This replica led and lost the Lease: it stops at once, so that it never decides beside
    /// the replica that leads now (the kubelet restarts it as a standby).
    #[error(
        "lost leadership: {0}; stopping so that only the new leader decides (restarts as a standby)"
    )]
    LeadershipLost(LostLease),
    /// Two plugins claim the same custom resource kind.
    #[error("plugins `{first}` and `{second}` both reconcile {kind}; load only one of them")]
    SameTarget {
        /// First plugin.
        first: String,
        /// Second plugin.
        second: String,
        /// The contested kind.
        kind: String,
    },
}
