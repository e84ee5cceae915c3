//! The etcd policy plugin for policy-host, as a WebAssembly component: `EtcdCluster`
//! resources (`etcd.database.coreos.com/v1beta2`, the classic etcd-operator API) run by
//! [`EtcdPlugin`], exported through the SDK's `export_plugin!`.
//!
//! The knowledge itself is `guest-etcd-core`, re-exported here whole (so `guest_etcd::spec`,
//! `guest_etcd::reconcile`, ... read as before); it is a crate of its own because the backup and
//! restore plugins build on it, and a crate that exports a plugin cannot be linked into
//! another plugin's component.

pub use guest_etcd_core::*;

policy_host_sdk::export_plugin!(EtcdPlugin);
