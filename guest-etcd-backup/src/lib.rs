//! The `EtcdBackup` plugin for policy-host: the classic etcd-operator's backup resource
//! (`etcd.database.coreos.com/v1beta2`), a snapshot of the cluster behind
//! `spec.etcdEndpoints` taken, proved to restore, uploaded to S3 and described in status.
//!
//! Built on `guest-etcd-core`, the etcd plugin's knowledge (its snapshot steps, etcd gateway
//! and S3 containers): the contract gives each plugin one
//! target kind, and a kind of its own keeps each plugin's grants and RBAC to what it needs
//! (this one creates Pods and asks their throwaway etcd; it never touches a cluster).
//!
//! - [`spec`] — the custom resource types, validation and (feature `crd`) the CRD.
//! - [`snapshot_pod`] — the Pod that saves, restores, uploads and serves one snapshot.
//! - [`reconcile`] — the decisions and the status they report.

pub mod reconcile;
pub mod snapshot_pod;
pub mod spec;

use guest_etcd_core::etcd_api::{CLIENT_PORT_NAME, GatewayEtcdApi};
use policy_host_sdk::log;
use policy_host_sdk::prelude::*;

/// The plugin's name, as the host knows it.
pub const PLUGIN_NAME: &str = "etcd-backup";

/// The custom resource this plugin reconciles: `etcdbackups.etcd.database.coreos.com`.
pub fn target_kind() -> KindRef {
    KindRef::namespaced(
        "etcd.database.coreos.com",
        "v1beta2",
        "EtcdBackup",
        "etcdbackups",
    )
}

/// The EtcdBackup plugin, as the host calls it.
pub struct EtcdBackupPlugin;

policy_host_sdk::export_plugin!(EtcdBackupPlugin);

impl Plugin for EtcdBackupPlugin {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: PLUGIN_NAME.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            target: target_kind(),
            children: vec![children::pod_kind()],
            capabilities: vec![Capability::AppCall(CLIENT_PORT_NAME.to_owned())],
            wants_finalizer: false,
        }
    }

    fn reconcile(
        observation: &Observation,
        app: &mut dyn AppCall,
    ) -> Result<Decision, PolicyError> {
        let mut etcd = GatewayEtcdApi::new(|request: &AppCallRequest| app.call(request));
        let decision = reconcile::reconcile(observation, &mut etcd)?;
        log::debug(
            "decided",
            &[("actions", &log::summarize(&decision.actions))],
        );
        Ok(decision)
    }
}

#[cfg(feature = "crd")]
pub use spec::custom_resource_definition;
