//! The `EtcdRestore` plugin for policy-host: the classic etcd-operator's restore resource
//! (`etcd.database.coreos.com/v1beta2`), a new `EtcdCluster` started from a snapshot in S3.
//!
//! Built on `guest-etcd-core`, the etcd plugin's knowledge (its EtcdCluster types, validation
//! and the classic S3 source). It creates the cluster as
//! its child with `spec.restore.s3` set, and the EtcdCluster plugin does the restoring; so
//! this plugin's grant is one kind (EtcdCluster) and no pod, port or app-call at all.
//!
//! The restored cluster is the EtcdRestore's child, as every object policy-host creates is
//! its parent's: deleting the EtcdRestore deletes the cluster, unless it is deleted with
//! `kubectl delete --cascade=orphan`.
//!
//! - [`spec`] — the custom resource types, validation and (feature `crd`) the CRD.
//! - [`reconcile`] — the decisions and the status they report.

pub mod reconcile;
pub mod spec;

use policy_host_sdk::log;
use policy_host_sdk::prelude::*;

/// The plugin's name, as the host knows it.
pub const PLUGIN_NAME: &str = "etcd-restore";

/// The custom resource this plugin reconciles: `etcdrestores.etcd.database.coreos.com`.
pub fn target_kind() -> KindRef {
    KindRef::namespaced(
        "etcd.database.coreos.com",
        "v1beta2",
        "EtcdRestore",
        "etcdrestores",
    )
}

/// The EtcdRestore plugin, as the host calls it.
pub struct EtcdRestorePlugin;

policy_host_sdk::export_plugin!(EtcdRestorePlugin);

impl Plugin for EtcdRestorePlugin {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: PLUGIN_NAME.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            target: target_kind(),
            children: vec![guest_etcd_core::target_kind()],
            capabilities: Vec::new(),
            wants_finalizer: false,
        }
    }

    fn reconcile(
        observation: &Observation,
        _app: &mut dyn AppCall,
    ) -> Result<Decision, PolicyError> {
        let decision = reconcile::reconcile(observation)?;
        log::debug(
            "decided",
            &[("actions", &log::summarize(&decision.actions))],
        );
        Ok(decision)
    }
}

#[cfg(feature = "crd")]
pub use spec::custom_resource_definition;
