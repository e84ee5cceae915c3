//! The etcd policy plugin for policy-host: everything about running etcd clusters, as pure
//! decisions.
//!
//! policy-host watches `EtcdCluster` resources (`etcd.database.coreos.com/v1beta2`, the
//! classic etcd-operator API) and, for each change, hands this plugin an
//! [`Observation`](protocol::Observation): the EtcdCluster, its Pods, Services,
//! PersistentVolumeClaims and PodDisruptionBudget, and the time. The plugin answers with a
//! [`Decision`](protocol::Decision): objects to apply or delete, the new status, Events, and
//! when to look again. The only thing it may do itself is ask etcd, through the host's
//! `app-call`, about membership ([`etcd_api`]).
//!
//! The crate is plain Rust that tests natively (`cargo test -p guest-etcd`); built for
//! `wasm32-wasip2` it is a WebAssembly component exporting the WIT world `policy-plugin`
//! (`wit/policy.wit`), with the glue in `wasm.rs`.
//!
//! - [`spec`] — the custom resource types (and, with feature `crd`, the CRD).
//! - [`protocol`] — Rust mirrors of the WIT types.
//! - [`etcd_api`] — what the plugin asks etcd, and the gateway JSON encoding.
//! - [`children`] — names and JSON of the Services, Pods, claims and budget.
//! - [`reconcile`] — the decisions.
//! - [`status`] — conditions and time formatting.

pub mod children;
pub mod etcd_api;
pub mod protocol;
pub mod reconcile;
pub mod spec;
pub mod status;

#[cfg(target_arch = "wasm32")]
mod wasm;

use protocol::{Capability, KindRef, PolicyInfo};

/// The plugin's name, as the host knows it.
pub const PLUGIN_NAME: &str = "etcd";

/// The custom resource this plugin reconciles: `etcdclusters.etcd.database.coreos.com`.
pub fn target_kind() -> KindRef {
    KindRef::namespaced(
        "etcd.database.coreos.com",
        "v1beta2",
        "EtcdCluster",
        "etcdclusters",
    )
}

/// What the plugin says about itself (the WIT `describe`).
pub fn policy_info() -> PolicyInfo {
    PolicyInfo {
        name: PLUGIN_NAME.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        target: target_kind(),
        children: vec![
            children::pod_kind(),
            children::service_kind(),
            children::pvc_kind(),
            children::pdb_kind(),
        ],
        capabilities: vec![Capability::AppCall(etcd_api::CLIENT_PORT_NAME.to_owned())],
        // Children carry owner references and go with the parent: nothing to clean up.
        wants_finalizer: false,
    }
}

#[cfg(feature = "crd")]
pub use spec::custom_resource_definition;
