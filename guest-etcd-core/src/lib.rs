//! The etcd knowledge of policy-host's etcd plugins: everything about running etcd clusters,
//! as pure decisions. The `guest-etcd` crate exports [`EtcdPlugin`] as the EtcdCluster
//! plugin's component; `guest-etcd-backup` and `guest-etcd-restore` build their plugins on
//! the rest. A library with no exports of its own, so each component exports one plugin.
//!
//! policy-host watches `EtcdCluster` resources (`etcd.database.coreos.com/v1beta2`, the
//! classic etcd-operator API) and, for each change, hands this plugin an
//! [`Observation`](protocol::Observation): the EtcdCluster, its Pods, Services,
//! PersistentVolumeClaims and PodDisruptionBudget, and the time. The plugin answers with a
//! [`Decision`](protocol::Decision): objects to apply or delete, the new status, Events, and
//! when to look again. The only thing it may do itself is ask etcd, through the host's
//! `app-call`, about membership and about the snapshots it verifies ([`etcd_api`]).
//!
//! The crate is plain Rust on the plugin SDK (`policy-host-sdk`, `wit/sdk`) and tests
//! natively (`cargo test -p guest-etcd-core`); `guest-etcd`, built for `wasm32-wasip2`, is the
//! WebAssembly component exporting the WIT world `policy-plugin` (`wit/policy.wit`):
//! [`EtcdPlugin`], through the SDK's `export_plugin!`.
//!
//! - [`spec`] — the custom resource types (and, with feature `crd`, the CRD).
//! - [`etcd_api`] — what the plugin asks etcd, and the gateway JSON encoding.
//! - [`children`] — names and JSON of the Services, Pods, claims and budget, and the `mc`
//!   containers that upload snapshots to an S3-compatible store and download one for a
//!   restore ([`children::object_store`]).
//! - [`pod_steps`] — what the one-shot containers of a backup or restore Pod report.
//! - [`schedule`] — the backup schedule (the SDK's: durations, times, when a snapshot is due).
//! - [`reconcile`] — the decisions, and the status conditions they report.
//! - [`metrics`] — the domain metrics each decision reports (members, leader, backups).

pub mod children;
pub mod classic;
pub mod etcd_api;
pub mod maintenance;
pub mod metrics;
pub mod pod_steps;
pub mod reconcile;
pub use policy_host_sdk::schedule;
pub mod spec;

/// The contract types (observation, decision, ...), which are the SDK's; kept under this
/// name for the crate's native users (the host's decision bench).
pub use policy_host_sdk::contract as protocol;

use policy_host_sdk::log;
use policy_host_sdk::prelude::*;

use crate::etcd_api::GatewayEtcdApi;

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

/// The etcd plugin, as the host calls it: etcd reached through the app-call client the
/// host hands over, each decision logged at debug level.
pub struct EtcdPlugin;

impl Plugin for EtcdPlugin {
    fn describe() -> PolicyInfo {
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
            // Children carry owner references and go with the parent: nothing to clean up,
            // so no finalizer (and the SDK's default `finalize`).
            wants_finalizer: false,
        }
    }

    fn metrics() -> Vec<policy_host_sdk::metrics::Metric> {
        metrics::declared()
    }

    fn reconcile(
        observation: &Observation,
        app: &mut dyn AppCall,
    ) -> Result<Decision, PolicyError> {
        let mut etcd = GatewayEtcdApi::new(|request: &AppCallRequest| app.call(request));
        let decision = reconcile::reconcile(observation, &mut etcd)?;
        let requeue = decision.requeue_after_ms.map(|ms| ms.to_string());
        log::debug(
            "decided",
            &[
                ("actions", &log::summarize(&decision.actions)),
                ("requeue_ms", requeue.as_deref().unwrap_or_default()),
            ],
        );
        Ok(decision)
    }
}

#[cfg(feature = "crd")]
pub use spec::custom_resource_definition;
